"""End a workshop (`make hub-end`, or `make hub-end LEARNER=eli`): each learner's account, home, scratch files and password removed, and said.

    python hub/end.py [--learner NAME]     (as root, with the hub stopped; HUB_DIR as for make hub)

For every learner with a home in ``HUB_DIR/users`` (or the one named): their
system user (hub/users.py's ``jupyter-NAME``, removed with ``userdel`` only when
its comment records that learner), their home with their workspace, the files
their user still owns in the machine's scratch folders (/tmp, /var/tmp,
/dev/shm: lesson 11's checkpoints, compilation caches), their user in the hub's
database, and their password (hub/signin.py), so that the name may be claimed again. Without root there are
no accounts: the homes and passwords go.
"""

from __future__ import annotations

import argparse
import dbm
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
sys.path.insert(0, str(ROOT / "hub"))


class EndError(RuntimeError):
    """The workshop cannot be ended now; the message says what to do."""


def scratch_of(uid: int, folders: tuple[Path, ...] = SCRATCH) -> list[Path]:
    """The entries at the top of ``folders`` that the user ``uid`` owns (their contents go with them)."""
    found = []
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        found += [p for p in entries if p.lstat().st_uid == uid]
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


def end_learner(name: str, hub_dir: Path, as_root: bool, scratch: tuple[Path, ...] = SCRATCH) -> list[str]:
    """Remove the learner ``name``'s account, home, scratch files and password; returns what was removed, a line each."""
    said = []
    home = hub_dir / "users" / name
    if as_root:
        import users  # hub/users.py (JupyterHub's spawner): only where accounts are made

        account_name = users.system_name(name)
        try:
            account = pwd.getpwnam(account_name)
        except KeyError:
            account = None
        if account is not None and users.owner_problem(account, name) is None:
            leftovers = scratch_of(account.pw_uid, scratch)
            for path in leftovers:
                remove(path)
            if leftovers:
                said.append(
                    f"{name}: {len(leftovers)} scratch entries of {account_name} ({', '.join(map(str, leftovers[:4]))}{', ...' if len(leftovers) > 4 else ''})"
                )
            done = subprocess.run(["userdel", account_name], capture_output=True, text=True)
            if done.returncode != 0:
                raise EndError(
                    f"userdel {account_name} failed ({done.stderr.strip()}): stop the learner's processes first."
                )
            said.append(f"{name}: the system user {account_name} (uid {account.pw_uid})")
        elif account is not None:
            said.append(f"{name}: kept {account_name}: {users.owner_problem(account, name)}")
    if home.is_dir():
        shutil.rmtree(home)
        said.append(f"{name}: the home {home} and the workspace in it")
    if forget_hub_user(hub_dir, name):
        said.append(f"{name}: the hub's user (their name leaves the admin page and the board)")
    try:
        with dbm.open(str(hub_dir / "passwords.dbm"), "w") as db:
            if db.get(name.encode("utf8")) is not None:
                del db[name.encode("utf8")]
                said.append(f"{name}: the password (the name may be claimed again)")
    except dbm.error:
        pass  # no passwords kept yet
    return said or [f"{name}: nothing of theirs was found"]


def end(hub_dir: Path, learner: str | None = None, as_root: bool | None = None) -> list[str]:
    """End the workshop in ``hub_dir`` for every learner, or for ``learner``; returns what was removed.

    Raises:
        EndError: the hub still runs, or the learner has no home there.
    """
    as_root = os.geteuid() == 0 if as_root is None else as_root
    with (hub_dir / "hub.lock").open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EndError(f"the hub still runs from {hub_dir}: stop it first (Ctrl-C in its terminal).") from None
        homes = (
            sorted(p.name for p in (hub_dir / "users").iterdir() if p.is_dir()) if (hub_dir / "users").is_dir() else []
        )
        if learner is not None and learner not in homes:
            raise EndError(
                f"no learner {learner!r} has a home in {hub_dir / 'users'} (learners there: {', '.join(homes) or 'none'})."
            )
        said = []
        for name in [learner] if learner is not None else homes:
            said += end_learner(name, hub_dir, as_root)
        return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learner", default=None, help="one learner's name (default: every learner)")
    args = parser.parse_args(argv)
    hub_dir = Path(os.environ.get("HUB_DIR", ROOT / ".hub")).resolve()
    if not hub_dir.is_dir():
        print(f"hub-end: {hub_dir} does not exist: nothing to end.", file=sys.stderr)
        return 2
    try:
        lines = end(hub_dir, args.learner or None)
    except EndError as err:
        print(f"hub-end: {err}", file=sys.stderr)
        return 2
    for line in lines:
        print(
            f"hub-end: removed {line}"
            if ": kept " not in line and "nothing of theirs" not in line
            else f"hub-end: {line}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
