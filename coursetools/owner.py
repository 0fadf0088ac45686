"""Work on a learner's folder as its owner: a command run by root never leaves root's files in a learner's workspace.

On `make hub` run as root each learner is a system user of their own
(hub/users.py). The instructor's workspace commands (the board's catch-up
and fresh copy, ``workspace ... --room .hub/users``) run as root; done as
root they would leave files the learner cannot save over, and would follow
links a learner placed in their own folder with root's rights. So when root
works on a folder another user owns, it does so in a child process that is
that user (their uid and group, no other groups).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


def other_owner(folder: Path) -> tuple[int, int] | None:
    """``(uid, gid)`` of the owner of ``folder`` (or of its nearest existing parent) when this is root and they are not.

    The folder itself is not followed when it is a link: a link a learner made
    counts as theirs.
    """
    if os.geteuid() != 0:
        return None
    for path in (folder, *folder.parents):
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):  # not there, or under a file (the command then refuses it)
            continue
        return (info.st_uid, info.st_gid) if info.st_uid != 0 else None
    return None


def as_owner(owner: tuple[int, int], work: Callable[[], int]) -> int:
    """``work()`` run in a child process as ``owner`` (uid, gid); returns its exit status (1 if it raised)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: drop to the owner, never come back
        status = 1
        try:
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
            status = work()
        except BaseException:  # noqa: BLE001 - the child reports any failure and exits
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)
