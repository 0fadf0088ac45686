"""hub/end.py (make hub-end): a workshop's learners removed, each said, with the hub stopped."""

from __future__ import annotations

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
import signin  # noqa: E402 - hub/signin.py


def hub_with(tmp_path: Path, *names: str) -> Path:
    hub = tmp_path / "hub"
    for name in names:
        (hub / "users" / name / "workspace").mkdir(parents=True)
        (hub / "users" / name / "workspace" / "04_sharding.ipynb").write_text("{}")
    auth = signin.WorkshopAuthenticator(workshop_password="room-pw-1", dbm_path=str(hub / "passwords.dbm"))
    import dbm

    with dbm.open(auth.dbm_path, "c") as db:
        for name in names:
            db[name.encode()] = b"hash"
    return hub


def test_one_learner_or_every_learner_is_removed_and_said(tmp_path):
    from jupyterhub import orm

    hub = hub_with(tmp_path, "eli", "zoë")
    session = orm.new_session_factory(f"sqlite:///{hub / 'jupyterhub.sqlite'}")()
    session.add_all([orm.User(name="eli"), orm.User(name="zoë")])
    session.commit()
    said = end.end(hub, "eli", as_root=False)
    assert said == [
        f"eli: the home {hub / 'users' / 'eli'} and the workspace in it",
        "eli: the hub's user (their name leaves the admin page and the board)",
        "eli: the password (the name may be claimed again)",
    ]
    assert [u.name for u in session.query(orm.User)] == ["zoë"]
    session.close()
    assert not (hub / "users" / "eli").exists() and (hub / "users" / "zoë").is_dir()
    assert end.end(hub, as_root=False)[0].startswith("zoë: the home")
    assert not list((hub / "users").iterdir())
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
def test_as_root_the_account_and_its_scratch_files_go_too(tmp_path):
    import users

    learner = f"t{uuid.uuid4().hex[:8]}"
    hub = hub_with(tmp_path, learner)
    account = users.ensure_user(users.system_name(learner), hub / "users" / learner, learner)
    scratch = tmp_path / "scratch"
    (scratch / "ckpt").mkdir(parents=True)
    mine = scratch / "ckpt"
    os.chown(mine, account.pw_uid, account.pw_gid)
    (scratch / "root-file").write_text("x")
    said = end.end_learner(learner, hub, as_root=True, scratch=(scratch,))
    assert f"{learner}: the system user {account.pw_name} (uid {account.pw_uid})" in said
    assert any("1 scratch entries" in line and str(mine) in line for line in said)
    assert subprocess.run(["getent", "passwd", account.pw_name], capture_output=True).returncode == 2
    assert not mine.exists() and (scratch / "root-file").exists()
