"""hub/end.py (make hub-end): a workshop's learners removed, each said, with the hub stopped."""

from __future__ import annotations

import dbm
import fcntl
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hub"))
import end  # noqa: E402 - hub/end.py


def hub_with(tmp_path: Path, *names: str, homeless: tuple[str, ...] = ()) -> Path:
    """A stopped hub's folder: ``names`` with a home and a password, ``homeless`` with a password only."""
    hub = tmp_path / "hub"
    for name in names:
        (hub / "users" / name / "workspace").mkdir(parents=True)
        (hub / "users" / name / "workspace" / "04_sharding.ipynb").write_text("{}")
    with dbm.open(str(hub / "passwords.dbm"), "c") as db:
        for name in (*names, *homeless):
            db[name.encode()] = b"hash"
    return hub


def test_one_learner_or_every_learner_is_removed_and_said(tmp_path):
    from jupyterhub import orm

    hub = hub_with(tmp_path, "eli", "zoë", homeless=("ghost",))  # ghost's claim never got a home
    session = orm.new_session_factory(f"sqlite:///{hub / 'jupyterhub.sqlite'}")()
    session.add_all([orm.User(name="eli"), orm.User(name="zoë")])
    session.commit()
    said = end.end(hub, "\uff25\uff2c\uff29", as_root=False)  # ＥＬＩ: found by the sign-in's folding
    assert said == [
        f"eli: the home {hub / 'users' / 'eli'} and the workspace in it",
        "eli: the hub's user (their name leaves the admin page and the board)",
        "eli: the password (the name may be claimed again)",
    ]
    assert [u.name for u in session.query(orm.User)] == ["zoë"]
    session.close()
    assert not (hub / "users" / "eli").exists() and (hub / "users" / "zoë").is_dir()
    (hub / "board-mistakes.json").write_text("[]")
    said = end.end(hub, as_root=False)
    assert said[0] == "ghost: the password (the name may be claimed again)" and said[1].startswith("zoë: the home")
    assert said[-1].startswith("the board: its list") and not (hub / "board-mistakes.json").exists()
    assert not list((hub / "users").iterdir()) and end.passwords(hub) == []
    with pytest.raises(end.EndError, match="no learner 'eli'"):
        end.end(hub, "eli", as_root=False)


def test_a_running_hub_is_not_ended_under_its_feet(tmp_path):
    hub = hub_with(tmp_path, "eli")
    with (hub / "hub.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(end.EndError, match="still runs"):
            end.end(hub, as_root=False)
    assert (hub / "users" / "eli").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="system users need root (make hub as root)")
def test_as_root_the_processes_then_the_account_and_its_scratch_files_go_and_a_failure_says_what_is_left(
    tmp_path, monkeypatch
):
    import users

    learner = f"t{uuid.uuid4().hex[:8]}"
    hub = hub_with(tmp_path, learner)
    account = users.ensure_user(users.system_name(learner), hub / "users" / learner, learner)
    scratch = tmp_path / "scratch"
    (scratch / "ckpt").mkdir(parents=True)
    mine = scratch / "ckpt"
    os.chown(mine, account.pw_uid, account.pw_gid)
    (scratch / "root-file").write_text("x")
    running = subprocess.Popen(["sleep", "300"], user=account.pw_uid, group=account.pw_gid)
    refused = subprocess.CompletedProcess([], 8, "", "userdel: user is currently used by process 1")
    monkeypatch.setattr(end.subprocess, "run", lambda *a, **k: refused)
    with pytest.raises(end.EndError) as failed:
        end.end_learner(learner, hub, as_root=True, scratch=(scratch,))
    said = str(failed.value)
    assert f"Removed so far: 1 processes of {account.pw_name}; 1 scratch entries of {account.pw_name} ({mine})" in said
    assert f"Left: the system user {account.pw_name}, the home" in said
    assert running.wait(timeout=10) == -15 and not mine.exists()  # SIGTERM first
    monkeypatch.undo()
    said = end.end_learner(learner, hub, as_root=True, scratch=(scratch,))
    assert f"{learner}: the system user {account.pw_name} (uid {account.pw_uid})" in said
    assert subprocess.run(["getent", "passwd", account.pw_name], capture_output=True).returncode == 2
    assert not mine.exists() and (scratch / "root-file").exists()


def test_make_hub_end_hands_the_name_over_as_data(tmp_path):
    marks = [f"pwn-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    name = f"x$(shell touch {marks[0]})`touch {marks[1]}`$(touch {marks[2]})\"'\ny"
    hub = hub_with(tmp_path, name)
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", "hub-install", "hub-end", f"LEARNER={name}"],
        cwd=ROOT,
        env={**os.environ, "HUB_DIR": str(hub)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert f"removed {name}: the home" in done.stdout and not (hub / "users" / name).exists()
    assert not [m for m in marks if (ROOT / m).exists() or (hub / m).exists()]
