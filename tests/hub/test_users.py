"""hub/users.py: learners' system user names, accounts made once, private homes, the spawner's user."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pwd
import re
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hub"))
import users  # noqa: E402 - hub/users.py


def run(coroutine):
    """``asyncio.run`` in a thread of its own: the session's Playwright browser keeps a loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making system users needs root (make hub as root)")


@as_root
def test_the_account_is_made_once_with_a_private_home_of_its_own(tmp_path):
    learner = f"T{uuid.uuid4().hex[:8]}:, x"  # characters useradd refuses in a name and in its comment
    name = users.system_name(learner)
    home = tmp_path / learner
    try:
        account = users.ensure_user(name, home, learner)
        assert users.ensure_user(name, home, learner).pw_uid == account.pw_uid  # the next start
        assert account.pw_uid != 0 and account.pw_shell == "/bin/bash"
        home.mkdir()
        (home / "workspace").mkdir()
        (home / "workspace" / "note.txt").write_text("made by root in an earlier run")
        os.symlink("/etc/hostname", home / "workspace" / "link")
        users.give_home(home, account)
        assert home.stat().st_mode & 0o777 == 0o700
        for path in (home, home / "workspace", home / "workspace" / "note.txt"):
            assert path.stat().st_uid == account.pw_uid, path
        assert os.stat("/etc/hostname").st_uid == 0  # a link is changed, never what it points to
        said = run(users.run_as(account, ["id", "-u"], {"PATH": "/usr/bin:/bin"}))
        assert said.strip() == str(account.pw_uid)
        with pytest.raises(RuntimeError, match=f"as {name} failed"):
            run(users.run_as(account, ["cat", "/etc/shadow"], {"PATH": "/usr/bin:/bin"}))
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@as_root
def test_the_spawner_runs_the_server_as_the_learners_account_with_its_home(tmp_path):
    learner = f"t{uuid.uuid4().hex[:8]}"
    name = users.system_name(learner)
    try:
        account = users.ensure_user(name, tmp_path / "elsewhere", learner)
        spawner = users.LearnerSpawner(user=SimpleNamespace(name=learner))
        spawner.home_dir = str(tmp_path / learner)
        env = spawner.user_env({})
        assert env["USER"] == name and env["HOME"] == str(tmp_path / learner) and env["SHELL"] == "/bin/bash"
        assert pwd.getpwnam(env["USER"]).pw_uid == account.pw_uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


# The names a learner may type that useradd would refuse or shorten: each is hashed.
ODD_NAMES = ["j.smith", "ana maría", "Bob", "jürgen", "a" * 25, "x" * 40, "mary o'neil", "李", "-x"]


def test_a_learner_never_gets_an_existing_account_or_another_learners():
    assert users.system_name("bob") == "jupyter-bob" and users.system_name("root") == "jupyter-root"
    assert users.system_name("j.smith") == "jupyter-j-smith-b33a535"
    for name in ODD_NAMES:
        hashed = users.system_name(name)
        assert hashed != users.PREFIX + name and len(hashed) <= users.NAME_MAX, name  # it was hashed
        assert re.fullmatch(r"jupyter-[a-z0-9_-]+", hashed), hashed  # what useradd takes
        taken = hashed.removeprefix(users.PREFIX)  # the name that would take it, typed at the sign-in page
        assert users.system_name(taken) != hashed, (name, taken)
    made = [users.system_name(n) for n in ODD_NAMES + [users.system_name(n)[8:] for n in ODD_NAMES]]
    assert len(set(made)) == len(made)


def passwd(name: str, gecos: str) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", 2000, 2000, gecos, "/nonexistent", "/bin/bash"))


def test_an_account_is_the_learners_only_when_its_comment_records_them():
    mine = passwd("jupyter-j-smith-b33a535", users.owner_comment("j.smith"))
    assert users.owner_problem(mine, "j.smith") is None
    said = users.owner_problem(mine, "j-smith-b33a535")
    assert said.startswith("The system user jupyter-j-smith-b33a535 was made for another learner")
    assert "`userdel jupyter-j-smith-b33a535`" in said and said.count(". ") == 0
    # The same shown name, another learner: the key tells them apart (the shown part is cut at 40 characters).
    long_one, long_two = "a" * 40 + "1", "a" * 40 + "2"
    assert users.owner_problem(passwd("x", users.owner_comment(long_one)), long_two) is not None
    # An earlier hub wrote the name alone: still theirs when it is their name exactly.
    assert users.owner_problem(passwd("jupyter-bob", "workshop learner bob"), "bob") is None
    assert users.owner_problem(passwd("jupyter-bob", "workshop learner bob"), "bob2") is not None
    assert users.owner_problem(passwd("x", "workshop learner ana?maria"), "ana:maria") is not None
    made_elsewhere = users.owner_problem(passwd("jupyter-bob", "Bob the admin"), "bob")
    assert "was not made by this course's hub" in made_elsewhere


@as_root
def test_two_learners_whose_names_once_met_get_two_accounts_and_an_account_is_never_handed_over(tmp_path):
    tag = uuid.uuid4().hex[:6]
    dotted, dashed = f"j.s{tag}", f"j-s{tag}-{users.system_name(f'j.s{tag}')[-7:]}"
    assert users.system_name(dashed) != users.system_name(dotted)
    names = [users.system_name(dotted), users.system_name(dashed)]
    try:
        first = users.ensure_user(names[0], tmp_path / dotted, dotted)
        second = users.ensure_user(names[1], tmp_path / dashed, dashed)
        assert first.pw_uid != second.pw_uid
        assert users.ensure_user(names[0], tmp_path / dotted, dotted).pw_uid == first.pw_uid  # the next hub
        # The next hub maps another learner to that account (a hash collision, an earlier hub's rule): refused.
        with pytest.raises(RuntimeError, match=f"The system user {names[0]} was made for another learner"):
            users.ensure_user(names[0], tmp_path / dashed, dashed)
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True)
