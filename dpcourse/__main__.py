"""``python -m dpcourse ...``: the previous layout's command line, handed to ``python -m coursetools`` for one release."""

from __future__ import annotations

import importlib.util
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m coursetools`` with the same arguments, after one line saying so.

    The course's tools (``run``, ``workspace``, ``sync``, ``timings``, ...) live
    in the repository's ``coursetools`` package, which the library never
    imports: this starts it as its own process. Returns its exit status, or 2
    with a sentence when ``coursetools`` cannot be found (the library was
    installed without the repository).
    """
    args = sys.argv[1:] if argv is None else argv
    print(
        "note: `python -m dpcourse` is now `python -m coursetools` (run from the course's repository); "
        "the old name goes in the next release.",
        file=sys.stderr,
    )
    if importlib.util.find_spec("coursetools") is None:
        print(
            "error: the course's tools (coursetools) are not on this Python's path: run this from the "
            "course's repository (cd to the folder with the Makefile), where `python -m coursetools` works.",
            file=sys.stderr,
        )
        return 2
    return subprocess.call([sys.executable, "-m", "coursetools", *args])


if __name__ == "__main__":
    sys.exit(main())
