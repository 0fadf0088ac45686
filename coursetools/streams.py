"""A lesson's saved outputs as the site publishes them: streams as a terminal leaves them, no machine paths."""

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


def without_machine_paths(text: str, folders: dict[str, str]) -> str:
    """``text`` with each of ``folders`` (an absolute path -> what to say instead) replaced, longest first.

    The site shows a lesson as it ran on the build machine; an error that names
    ``/tmp/dpcourse-checkpoints-x1y2/other`` reads ``$TMPDIR/dpcourse-checkpoints-x1y2/other``.
    """
    for folder in sorted(folders, key=len, reverse=True):
        if len(folder) > 1:  # never "/"
            text = text.replace(folder.rstrip("/") + "/", folders[folder] + "/").replace(folder, folders[folder])
    return text


def machine_folders(root) -> dict[str, str]:
    """The build machine's folders, and what a page says instead: the course's checkout, the temporary folder, home."""
    import tempfile
    from pathlib import Path

    return {str(root): "<the course's folder>", tempfile.gettempdir(): "$TMPDIR", str(Path.home()): "~"}


def publishable(out, folders: dict[str, str]) -> None:
    """An output's text, and its text/plain and text/html data, without ``folders`` (:func:`without_machine_paths`)."""
    if "text" in out:
        out["text"] = without_machine_paths("".join(out["text"]), folders)
    for kind in ("text/plain", "text/html"):
        if kind in out.get("data", {}):
            out["data"][kind] = without_machine_paths("".join(out["data"][kind]), folders)
