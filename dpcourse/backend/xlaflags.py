"""Check ``XLA_FLAGS`` before JAX starts: XLA aborts the whole process on a token it does not know.

XLA parses ``XLA_FLAGS`` when its backend starts and, on any token it does
not recognise, prints ``Unknown flag in XLA_FLAGS: ...`` (on a value it
cannot read, ``Couldn't interpret value V for flag F`` and its whole flag
list) and ends the process (a fatal log line in xla/parse_flags_from_env.cc, exit status 1;
jaxlib 0.10.2): in a notebook the kernel dies without a Python error. :func:`check_xla_flags` finds such
tokens first and names them with the fix:

* by their form, at no cost: a dash that is not ``-`` (an en dash ``–``
  typed or pasted for ``--``), a word that is not a flag (often a value
  written after a space: ``--xla_force_host_platform_device_count 8``);
* well-formed names XLA does not know (``--not_a_flag``) and values it
  refuses (``--xla_cpu_enable_fast_math=maybe``): by starting XLA
  once in a short subprocess with ``JAX_PLATFORMS=cpu`` (the cost of
  importing JAX: 10 to 13 s measured on the shared, loaded 2-core build machine), only when ``XLA_FLAGS`` holds flags other than
  the course's own device count, and only once per distinct value and
  jaxlib version (a value XLA started with is cached in ``~/.cache/dpcourse``;
  nothing else is remembered).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
# Characters that look like "-" but are not (what a word processor or a web page puts for "--").
_DASHES = {
    "\u2013": "an en dash (–)",
    "\u2014": "an em dash (—)",
    "\u2212": "a minus sign (−)",
    "\u2010": "a hyphen (‐)",
}
_WELL_FORMED = re.compile(r"^--[A-Za-z][A-Za-z0-9_]*(=.*)?$")
CACHE_ENV = "DPCOURSE_CACHE_DIR"
PROBE_TIMEOUT_S = 120.0


class XlaFlagsError(ValueError):
    """``XLA_FLAGS`` holds a token XLA would abort on; the message names it and the fix."""


def _fix(message: str, flags: str | None = None) -> str:
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    return (
        f"XLA_FLAGS={flags!r}: {message} XLA aborts the process on such a token "
        "(in a notebook, the kernel dies). Fix or unset XLA_FLAGS in the shell that starts Python or Jupyter "
        "(export XLA_FLAGS=..., or unset XLA_FLAGS), then restart the kernel."
    )


def form_problems(flags: str) -> list[str]:
    """What is wrong with each malformed token of ``flags``, judged by form alone (no JAX started).

    Returns:
        One sentence per bad token, naming it and the fix; empty when every
        token has the form ``--name`` or ``--name=value``.
    """
    problems = []
    tokens = flags.split()
    if tokens and not tokens[0].startswith(("--", *_DASHES)) and os.path.isfile(flags.strip()):
        return []  # XLA_FLAGS may name a file of flags (XLA reads it); the probe checks its flags
    for i, token in enumerate(tokens):
        bad_dash = next((name for ch, name in _DASHES.items() if ch in token.split("=", 1)[0]), None)
        if bad_dash:
            fixed = re.sub("[" + "".join(_DASHES) + "]+", "--", token.split("=", 1)[0], count=1)
            fixed += token[len(token.split("=", 1)[0]) :]
            problems.append(
                f"the token {token!r} starts with {bad_dash}, not two hyphens (often pasted from a document); "
                f"type it as {fixed!r}."
            )
        elif _WELL_FORMED.match(token):
            continue
        elif i > 0 and _WELL_FORMED.match(tokens[i - 1]) and "=" not in tokens[i - 1]:
            problems.append(
                f"the token {token!r} is not a flag: it looks like the value of {tokens[i - 1]}, written after a "
                f"space; write {tokens[i - 1]}={token} (with '=', no space)."
            )
        else:
            problems.append(
                f"the token {token!r} is not a flag (each token must read --name or --name=value, separated by spaces)."
            )
    return problems


def _course_only(flags: str) -> bool:
    """Whether ``flags`` holds nothing but the course's own simulated-device count (known to XLA)."""
    return all(re.fullmatch(re.escape(CPU_COUNT_FLAG) + r"=\d+", t) for t in flags.split())


def _cache_file() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "dpcourse")
    return Path(base) / "xla-flags-checked.json"


def _cache_key(flags: str) -> str:
    try:
        from importlib.metadata import version

        jaxlib = version("jaxlib")
    except Exception:  # noqa: BLE001 - no jaxlib metadata: key on the interpreter only
        jaxlib = "?"
    return hashlib.sha256(f"{sys.executable}\0{jaxlib}\0{flags}".encode()).hexdigest()[:32]


def _cached_ok(key: str) -> bool:
    try:
        return key in json.loads(_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _remember_ok(key: str) -> None:
    path = _cache_file()
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(known, list):
            known = []
    except (OSError, ValueError):
        known = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted(set(known[-200:]) | {key})), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only home: check again next time
        pass


# XLA's fatal lines (xla/parse_flags_from_env.cc, jaxlib 0.10 to 0.12): the process exits with status 1.
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: *(.*)")
_NOT_A_FILE = re.compile(r'Could not open file "(.*)" to read flags for environment variable "XLA_FLAGS"')


def unknown_flags_in(stderr: str) -> str | None:
    """The tokens XLA named in its ``Unknown flag in XLA_FLAGS: ...`` line in ``stderr``, or None."""
    for line in stderr.splitlines():
        match = _UNKNOWN.search(line)
        if match:
            return match.group(1).strip() or "?"
    return None


_BAD_VALUE = re.compile(r"Couldn't interpret value (.*) for flag (\w+)")
_GLOG_PREFIX = re.compile(r"^[EFWI]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")
_TYPE_WORDS = {"bool": "true or false", "int32": "a whole number", "int64": "a whole number", "float": "a number"}


def bad_value_in(stderr: str) -> str | None:
    """A sentence for XLA's ``Couldn't interpret value V for flag F`` in ``stderr`` (a dead process's), or None.

    The sentence names the flag, the value, XLA's own line and the fix; the
    flag's type and default come from the flag list XLA prints after that
    line (``--name=default<TAB>type<TAB>help``), so no list of flags is kept
    here.
    """
    lines = stderr.splitlines()
    for line in lines:
        match = _BAD_VALUE.search(line)
        if not match:
            continue
        value, name = match.group(1), match.group(2)
        own = _GLOG_PREFIX.sub("", line).strip()
        listed = next((x for x in lines if x.strip().startswith(f"--{name}=") and "\t" in x), None)
        fix = f"give --{name} a value XLA accepts, or remove it"
        if listed:
            fields = [f.strip() for f in listed.strip().split("\t") if f.strip()]
            if len(fields) >= 2:
                default, kind = fields[0].split("=", 1)[1], fields[1]
                shown = default or '""'
                example = f"--{name}=true or --{name}=false" if kind == "bool" else f"--{name}={shown}"
                accepts = _TYPE_WORDS.get(kind, f"a {kind}")
                fix = (
                    f"--{name} takes {accepts} (XLA's default is {shown}): write, for example, {example}, or remove it"
                )
        return f"XLA refuses the value {value!r} of --{name} (XLA says: {own!r}); {fix}."
    return None


def refusal_in(stderr: str) -> str | None:
    """Why XLA refused ``XLA_FLAGS``, from a dead process's ``stderr``: an unknown flag or a bad value; else None."""
    unknown = unknown_flags_in(stderr)
    if unknown is not None:
        return (
            f"XLA does not know {unknown} (it says 'Unknown flag in XLA_FLAGS'). Check the spelling "
            "against XLA's flag list (xla/debug_options_flags.cc) or remove it."
        )
    return bad_value_in(stderr)


def probe_refusal(flags: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str | None]:
    """Start XLA's CPU backend once in a subprocess with ``XLA_FLAGS=flags``.

    Returns:
        ``(started, refusal)``: ``started`` is True only when XLA started
        (only then may the value be remembered as good); ``refusal`` is the
        sentence naming what XLA refused (:func:`refusal_in`), or None when
        it started or failed for a reason that is not ``XLA_FLAGS`` (the real
        start then reports it) or the probe could not run.
    """
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices('cpu')"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False, None
    if out.returncode == 0:
        return True, None
    return False, refusal_in(out.stderr)


def check_xla_flags(flags: str | None = None, probe: bool = True) -> None:
    """Refuse an ``XLA_FLAGS`` (default: the environment's) that would make XLA abort.

    Args:
        flags: the value to check (default ``os.environ["XLA_FLAGS"]``).
        probe: also ask XLA, in a subprocess, whether it accepts every
            well-formed flag and its value (skipped when ``flags`` is empty or
            only the course's device count, and for a value that passed before;
            only a value XLA started with is remembered).

    Raises:
        XlaFlagsError: a token is malformed, unknown to XLA, or has a value XLA
            refuses; the message names the token (and the value, with XLA's own
            line), says it is in ``XLA_FLAGS``, and gives the fix.
    """
    if flags is None:
        flags = os.environ.get("XLA_FLAGS", "")
    problems = form_problems(flags)
    if problems:
        raise XlaFlagsError(_fix(" ".join(p[0].upper() + p[1:] for p in problems), flags))
    if not probe or not flags.strip() or _course_only(flags):
        return
    key = _cache_key(flags)
    if _cached_ok(key):
        return
    started, refusal = probe_refusal(flags)
    if refusal is not None:
        raise XlaFlagsError(_fix(refusal, flags))
    if started:
        _remember_ok(key)


def exit_on_bad_xla_flags(flags: str | None = None) -> None:
    """A command's first act: :func:`check_xla_flags`, and on a bad token ``error: <the sentence>`` and exit 2.

    Every command that starts JAX or a compile calls it (or
    :func:`check_xla_flags` itself) before any work, so a bad token is named
    in one line instead of XLA's flag list or a traceback.

    Raises:
        SystemExit: status 2, after printing the sentence to stderr.
    """
    try:
        check_xla_flags(flags)
    except XlaFlagsError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def describe_abort(stderr: str) -> str | None:
    """A one-line reason when ``stderr`` (a dead process's) shows XLA's abort on ``XLA_FLAGS``, else None."""
    unknown = unknown_flags_in(stderr)
    if unknown is not None:
        return _fix(f"XLA does not know {unknown}, and stopped the process.")
    bad_value = bad_value_in(stderr)
    if bad_value is not None:
        return _fix(f"{bad_value[:-1]}; XLA stopped the process.")
    match = next((m for m in map(_NOT_A_FILE.search, stderr.splitlines()) if m), None)
    if match:
        return _fix(
            f"XLA read {match.group(1)!r} as the name of a file of flags (it does not start with --) and found no "
            "such file.",
        )
    return None
