"""A lesson's saved stream outputs as a terminal would have left them, for the site (coursetools.site)."""

from __future__ import annotations


def final_text(text: str) -> str:
    """A stream as a terminal leaves it: each line's state after its last ``\\r`` (a tqdm bar's final one)."""
    lines = (line.rstrip("\r") for line in text.split("\n"))  # a Windows line end is no rewrite
    return "\n".join(line.rsplit("\r", 1)[-1] for line in lines)


def merged_streams(outputs: list) -> list:
    """``outputs`` with each run of one stream's outputs as one, in :func:`final_text`'s state (a tqdm bar: one line)."""
    merged: list = []
    for out in outputs:
        if out.get("output_type") == "stream":
            text = "".join(out["text"]) if isinstance(out.get("text"), list) else out.get("text", "")
            last = merged[-1] if merged else None
            if last is not None and last.get("output_type") == "stream" and last.get("name") == out.get("name"):
                last["text"] = final_text(last["text"] + text)
                continue
            out["text"] = final_text(text)
        merged.append(out)
    return merged
