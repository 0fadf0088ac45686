"""End a workshop (`make hub-end`, or `make hub-end LEARNER=eli`): each learner's processes, account, home, scratch files and password removed, and said.

    python hub/end.py [--learner NAME]     (as root, with the hub stopped; HUB_DIR as for make hub)

`make hub-end LEARNER=...` hands the name over in the environment
(``HUB_END_LEARNER``), never in a shell line. The learner is found by the same
folding the sign-in compares names with (hub/signin.py's ``fold``: ``ELI``
finds ``eli``). For every learner with a home in ``HUB_DIR/users`` or a
password (one who never got a home too), or the one named: the processes
their system user still runs (hub/users.py's ``jupyter-NAME``: SIGTERM, then
SIGKILL), the files that user owns in the machine's scratch folders (/tmp,
/var/tmp, /dev/shm: lesson 11's checkpoints, compilation caches), the user
(``userdel``, only when its comment records that learner), their home with
their workspace, their user in the hub's database, and their password, so
that the name may be claimed again. Without root there are no accounts: the
homes and passwords go; ending every learner, the board's list of
mistakes (hub/board.py) goes too. When a step fails, what was removed and what is left
are said.
"""

from __future__ import annotations

import argparse
import contextlib
import dbm
import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
sys.path.insert(0, str(ROOT / "hub"))


class EndError(RuntimeError):
    """The workshop cannot be ended now, or not for every learner; the message says what to do.

    ``said``: what was removed before (ending every learner, the others are still ended).
    """

    def __init__(self, message: str, said: list[str] | None = None) -> None:
        super().__init__(message)
        self.said = said or []


def scratch_of(uid: int, folders: tuple[Path, ...] = SCRATCH) -> list[Path]:
    """The entries at the top of ``folders`` that the user ``uid`` owns (their contents go with them)."""
    found = []
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            with contextlib.suppress(OSError):  # an entry another process removed a moment ago
                if path.lstat().st_uid == uid:
                    found.append(path)
    return sorted(found)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def forget_hub_user(hub_dir: Path, name: str) -> bool:
    """Delete the user ``name`` (their servers' and tokens' rows with it) from the hub's database; True when there was one."""
    path = hub_dir / "jupyterhub.sqlite"
    if not path.is_file():
        return False
    from jupyterhub import orm

    session = orm.new_session_factory(f"sqlite:///{path}")()
    try:
        user = session.query(orm.User).filter_by(name=name).first()
        if user is None:
            return False
        session.delete(user)
        session.commit()
        return True
    finally:
        session.close()


def processes_of(uid: int) -> list[int]:
    """The processes whose owner is ``uid`` (Linux /proc), zombies (ended, not yet reaped) left out."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid == uid and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def end_processes(uid: int, grace_s: float = 5.0) -> tuple[int, list[int]]:
    """SIGTERM every process of ``uid``, SIGKILL what is left after ``grace_s``; (how many there were, pids left)."""
    first = processes_of(uid)
    for number in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_of(uid):
            with contextlib.suppress(OSError):
                os.kill(pid, number)
        deadline = time.monotonic() + grace_s
        while processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return len(first), processes_of(uid)


def passwords(hub_dir: Path) -> list[str]:
    """The names whose password the sign-in keeps (hub/signin.py), claimed or not."""
    try:
        with dbm.open(str(hub_dir / "passwords.dbm"), "r") as db:
            return sorted(key.decode("utf8") for key in db.keys())  # noqa: SIM118 - dbm.gnu cannot be iterated
    except dbm.error:
        return []  # no passwords kept yet


def end_learner(name: str, hub_dir: Path, as_root: bool, scratch: tuple[Path, ...] = SCRATCH) -> list[str]:
    """Remove the learner ``name``'s processes, account, home, scratch files and password; what was removed, a line each.

    Raises:
        EndError: a step failed; the message says what was removed and what is left.
    """
    said = []
    home = hub_dir / "users" / name

    def stop(why: str, left: str) -> EndError:
        removed = "; ".join(line.split(": ", 1)[1] for line in said) or "nothing"
        return EndError(f"{name}: {why}. Removed so far: {removed}. Left: {left}; then run make hub-end again.")

    if as_root:
        import users  # hub/users.py (JupyterHub's spawner): only where accounts are made

        account_name = users.system_name(name)
        try:
            account = pwd.getpwnam(account_name)
        except KeyError:
            account = None
        if account is not None and users.owner_problem(account, name) is None:
            ended, left = end_processes(account.pw_uid)
            if ended:
                said.append(f"{name}: {ended} processes of {account_name}")
            if left:
                raise stop(
                    f"{len(left)} processes of {account_name} did not end ({' '.join(map(str, left[:8]))})",
                    f"those processes, the system user {account_name}, the home, the password: end them "
                    f"(kill -KILL {' '.join(map(str, left[:8]))})",
                )
            leftovers = scratch_of(account.pw_uid, scratch)
            for path in leftovers:
                remove(path)
            if leftovers:
                shown = ", ".join(map(str, leftovers[:4])) + (", ..." if len(leftovers) > 4 else "")
                said.append(f"{name}: {len(leftovers)} scratch entries of {account_name} ({shown})")
            done = subprocess.run(["userdel", account_name], capture_output=True, text=True)
            if done.returncode != 0:
                raise stop(
                    f"userdel {account_name} failed ({done.stderr.strip()})",
                    f"the system user {account_name}, the home {home}, the hub's user and the password",
                )
            said.append(f"{name}: the system user {account_name} (uid {account.pw_uid})")
        elif account is not None:
            said.append(f"{name}: kept {account_name}: {users.owner_problem(account, name)}")
    if home.is_dir():
        shutil.rmtree(home)
        said.append(f"{name}: the home {home} and the workspace in it")
    if forget_hub_user(hub_dir, name):
        said.append(f"{name}: the hub's user (their name leaves the admin page and the board)")
    if name in passwords(hub_dir):
        with dbm.open(str(hub_dir / "passwords.dbm"), "w") as db:
            del db[name.encode("utf8")]
        said.append(f"{name}: the password (the name may be claimed again)")
    return said or [f"{name}: nothing of theirs was found"]


def end(hub_dir: Path, learner: str | None = None, as_root: bool | None = None) -> list[str]:
    """End the workshop in ``hub_dir`` for every learner (a home or a password), or for ``learner``; what was removed.

    ``learner`` is found by :func:`signin.fold`, as the sign-in compares names.

    Raises:
        EndError: the hub still runs, no learner (or more than one) folds onto ``learner``, or a step failed.
    """
    from signin import fold  # hub/signin.py

    as_root = os.geteuid() == 0 if as_root is None else as_root
    with (hub_dir / "hub.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EndError(f"the hub still runs from {hub_dir}: stop it first (Ctrl-C in its terminal).") from None
        users_dir = hub_dir / "users"
        homes = sorted(p.name for p in users_dir.iterdir() if p.is_dir()) if users_dir.is_dir() else []
        names = sorted({*homes, *passwords(hub_dir)})
        if learner is not None:
            found = [n for n in names if n == learner] or [n for n in names if fold(n) == fold(learner)]
            if len(found) != 1:
                raise EndError(
                    f"{'no learner' if not found else 'more than one learner'} {learner!r} in {hub_dir} "
                    f"(learners there: {', '.join(map(ascii, found or names)) or 'none'}): name one as it is listed."
                )
            names = found
        said, failed = [], []
        for name in names:
            try:
                said += end_learner(name, hub_dir, as_root)
            except EndError as err:
                failed.append(str(err))
        mistakes = hub_dir / "board-mistakes.json"  # hub/board.py's memory: it names learners
        if learner is None and mistakes.is_file():
            mistakes.unlink()
            said.append(f"the board: its list of the room's mistakes ({mistakes})")
        if failed:
            raise EndError("\n".join(failed), said)
        return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learner", default=None, help="one learner's name (default: every learner)")
    args = parser.parse_args(argv)
    learner = args.learner or os.environ.get("HUB_END_LEARNER") or None  # make hub-end LEARNER=...
    hub_dir = Path(os.environ.get("HUB_DIR", ROOT / ".hub")).resolve()
    if not hub_dir.is_dir():
        print(f"hub-end: {hub_dir} does not exist: nothing to end.", file=sys.stderr)
        return 2
    try:
        lines, failed = end(hub_dir, learner), None
    except EndError as err:
        lines, failed = err.said, err
    for line in lines:
        print(f"hub-end: {line}" if ": kept " in line or "nothing of theirs" in line else f"hub-end: removed {line}")
    if failed is not None:
        print("\n".join(f"hub-end: {line}" for line in str(failed).splitlines()), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
