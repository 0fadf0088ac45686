"""Each learner as a system user of their own when `make hub` runs as root: names, accounts, homes, the spawner.

The Littlest JupyterHub's way (tljh/user.py and tljh/normalize.py, TLJH 1.0):
a learner who signs in as ``bob`` gets the system user ``jupyter-bob``, made
with ``useradd`` the first time their server starts, so that no name typed at
the sign-in page (``root``, ``daemon``, ...) is ever an existing account.
Their server runs as that user (JupyterHub's ``LocalProcessSpawner``, which
switches user before it starts the server); their home, ``HUB_DIR/users/bob``,
is theirs alone (0700) and holds their workspace.

Without root the hub cannot switch users: every server runs as the hub's own
user, and hub/launch.py asks the instructor to confirm that first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import re
import subprocess
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid

PREFIX = "jupyter-"  # TLJH's prefix for its users' system accounts
# useradd's longest name on Linux (shadow-utils: LOGIN_NAME_MAX less one, 32 in glibc's utmp).
NAME_MAX = 32
HASHED = re.compile(r"(^|-)[0-9a-f]{7}$")  # how a hashed name ends (system_name); all of it where nothing was left
COMMENT = "workshop learner "  # how the comment of an account the hub made begins (owner_comment)


def system_name(learner: str) -> str:
    """The system user of the learner ``learner``: ``jupyter-<name>``, or a shortened name with a hash.

    A name useradd would refuse or shorten (upper case, characters outside
    ``a-z0-9_-``, longer than :data:`NAME_MAX` with the prefix), and a name
    that itself ends like a hashed one (7 hex digits, alone or after ``-``), becomes
    ``jupyter-<cleaned, cut>-<7 hex digits of its SHA-256>``. So a plain name
    never equals another learner's hashed one (``j-smith-b33a535`` and
    ``j.smith`` get two accounts); two hashed names coincide only when 28 bits
    of SHA-256 do, and :func:`ensure_user` refuses to hand over an account
    made for another learner.
    """
    plain = PREFIX + learner
    if re.fullmatch(r"[a-z0-9_][a-z0-9_-]*", learner) and len(plain) <= NAME_MAX and not HASHED.search(learner):
        return plain
    cleaned = re.sub(r"[^a-z0-9_-]+", "-", learner.lower()).strip("-")
    digest = hashlib.sha256(learner.encode("utf-8")).hexdigest()[:7]
    return f"{(PREFIX + cleaned)[: NAME_MAX - 8].rstrip('-')}-{digest}"


def owner_key(learner: str) -> str:
    """What an account's comment records of the learner it was made for: 24 hex digits of the name's SHA-256."""
    return hashlib.sha256(learner.encode("utf-8")).hexdigest()[:24]


def _shown(learner: str) -> str:
    """The learner's name as an account's comment can hold it (useradd refuses ':', ',' and '=')."""
    return re.sub(r"[^\w .@-]", "?", learner)[:40]


def owner_comment(learner: str) -> str:
    """The comment (GECOS) of the account made for ``learner``: their name, readable, and :func:`owner_key`."""
    return f"{COMMENT}{_shown(learner)} #{owner_key(learner)}"


def owner_problem(account: pwd.struct_passwd, learner: str) -> str | None:
    """Why the existing account ``account`` is not the learner ``learner``'s (one sentence), or None when it is.

    It is theirs when its comment is :func:`owner_comment` of their name, or,
    made by an earlier version of the hub that wrote the name alone, when that
    name is theirs exactly.
    """
    gecos = account.pw_gecos
    found = re.fullmatch(re.escape(COMMENT) + r"(.*?)(?: #([0-9a-f]{24}))?", gecos)
    if found and (found[2] == owner_key(learner) or (found[2] is None and found[1] == learner == _shown(learner))):
        return None
    whom = "was made for another learner" if found else "was not made by this course's hub"
    return (
        f"The system user {account.pw_name} {whom} (its comment: {gecos!r}), so it is not given to the learner "
        f"{learner!r}: sign in under another name, or, if that account is left from an earlier workshop and its "
        f"files are no longer needed, the instructor can remove it (`userdel {account.pw_name}`) and start the server again."
    )


def ensure_user(name: str, home: Path, learner: str) -> pwd.struct_passwd:
    """The system user ``name`` of the learner ``learner``, made with ``useradd`` (a group of its own, bash, home ``home``) if missing.

    The account's comment records whom it was made for (:func:`owner_comment`);
    an existing account is used only when it records this learner, so one made
    by this or an earlier hub for someone else is never handed over.

    Raises:
        RuntimeError: useradd failed, or the account is another's (:func:`owner_problem`; what to do).
    """
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        # The server gets HOME from the spawner; the account's own field only where useradd takes the path.
        home_field = "/nonexistent" if re.search(r"[:,\s]", str(home)) else str(home)
        command = ["useradd", "--user-group", "--no-create-home", "--home-dir", home_field, "--shell", "/bin/bash"]
        made = subprocess.run([*command, "--comment", owner_comment(learner), name], capture_output=True, text=True)
        try:  # another server's start may have made it a moment before
            account = pwd.getpwnam(name)
        except KeyError:
            raise RuntimeError(
                f"could not make the system user {name} for the learner {learner!r} ({made.stderr.strip()}): "
                "useradd must work on this machine for `make hub` as root."
            ) from None
    problem = owner_problem(account, learner)
    if problem:
        raise RuntimeError(problem)
    return account


def give_home(home: Path, account: pwd.struct_passwd) -> None:
    """``home`` made if missing, owned by ``account`` and private (0700), with what is in it (links not followed)."""
    home.mkdir(mode=0o700, parents=False, exist_ok=True)
    if os.lstat(home).st_uid != account.pw_uid:  # a home from a run without root, or another account
        for folder, dirs, files in os.walk(home):
            for entry in (folder, *(os.path.join(folder, n) for n in (*dirs, *files))):
                os.chown(entry, account.pw_uid, account.pw_gid, follow_symlinks=False)
    os.chmod(home, 0o700)


async def run_as(account: pwd.struct_passwd, command: list[str], env: dict[str, str]) -> str:
    """``command`` run as ``account`` (its uid, its group, no other groups); returns its output.

    Raises:
        RuntimeError: it exited with a failure (the end of its output in the message).
    """
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        cwd="/",
    )
    output, _ = await process.communicate()
    text = output.decode(errors="replace")
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} as {account.pw_name} failed ({process.returncode}): {text[-800:]}")
    return text


class LearnerSpawner(LocalProcessSpawner):
    """JupyterHub's LocalProcessSpawner for the learner's own system user (:func:`system_name`).

    hub/jupyterhub_config.py's ``pre_spawn_hook`` makes the user and the home
    first; this class runs the server as that user, with ``HOME`` there.
    """

    home_dir = ""  # set by the pre-spawn hook: HUB_DIR/users/<learner>

    @property
    def system_user(self) -> str:
        return system_name(self.user.name)

    def make_preexec_fn(self, name: str):
        # The home the server starts in is the notebook_dir's parent; the
        # account's own pw_dir may name an older HUB_DIR.
        return set_user_setuid(self.system_user, chdir=False)

    def user_env(self, env: dict) -> dict:
        account = pwd.getpwnam(self.system_user)
        env.update(USER=account.pw_name, LOGNAME=account.pw_name, HOME=self.home_dir or account.pw_dir)
        env["SHELL"] = account.pw_shell or "/bin/bash"
        return env
