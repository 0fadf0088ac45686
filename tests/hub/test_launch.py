"""hub/launch.py and hub/jupyterhub_config.py without starting a hub: refusals, users, secrets, GPU shares, workspaces."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hubprocess import BASE_PORT
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "hub" / "launch.py"
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
PORT = BASE_PORT + 6  # inside the hub tests' range, away from the room test's hub ports


sys.path.insert(0, str(ROOT / "hub"))
import launch as launcher  # noqa: E402 - hub/launch.py


def launch(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        HUB_DIR=str(tmp_path / "hub"),
        HUB_PORT=str(PORT),
        HUB_PASSWORD="long-enough-1",
        HUB_SHARED_USER_OK="1",
    )
    env.update(settings)
    return subprocess.run([sys.executable, str(LAUNCH)], env=env, capture_output=True, text=True, timeout=60)


def test_an_open_address_without_tls_is_refused(tmp_path):
    result = launch(tmp_path, HUB_IP="0.0.0.0")
    assert result.returncode == 2
    assert "plain HTTP" in result.stderr and "HUB_SSL_CERT" in result.stderr and "TLS in front" in result.stderr


def test_a_certificate_needs_its_key(tmp_path):
    result = launch(tmp_path, HUB_SSL_CERT="cert.pem")
    assert result.returncode == 2 and "HUB_SSL_CERT and HUB_SSL_KEY together" in result.stderr


def test_a_short_workshop_password_is_refused(tmp_path):
    result = launch(tmp_path, HUB_PASSWORD="short")
    assert result.returncode == 2 and "HUB_PASSWORD must have at least 8 characters" in result.stderr


def test_a_second_hub_on_the_same_folder_is_refused(tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "jupyterhub.pid").write_text("4242\n")
    with (folder / "hub.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = launch(tmp_path)
    assert result.returncode == 2
    assert f"a hub is already running from {folder} (pid 4242)" in result.stderr and "stray proxy" in result.stderr


def test_a_busy_port_is_named(tmp_path):
    with socket.socket() as busy:
        # SO_REUSEADDR: an earlier test's hub may leave the port in TIME_WAIT; listening still takes it.
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", PORT + 1))
        busy.listen()
        result = launch(tmp_path)
    assert result.returncode == 2 and f"port {PORT + 1} (proxy API) is in use" in result.stderr


def load_config(monkeypatch, **env: str) -> dict:
    """hub/jupyterhub_config.py run as JupyterHub runs it (with `c`), its names returned (HUB_DIR given)."""
    (Path(env["HUB_DIR"]) / "password").write_text("long-enough-1\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace = {"c": Config(), "__file__": str(CONFIG), "__name__": "jupyterhub_config"}
    exec(compile(CONFIG.read_text(), str(CONFIG), "exec"), namespace)
    return namespace


def test_config_never_open_and_culler_scoped(monkeypatch, tmp_path):
    ns = load_config(monkeypatch, HUB_DIR=str(tmp_path))
    c = ns["c"]
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8000"
    # Each learner's own password (hub/signin.py); the workshop password only claims a new name.
    assert c.JupyterHub.authenticator_class == "signin.WorkshopAuthenticator"
    assert c.WorkshopAuthenticator.workshop_password == "long-enough-1"
    assert c.WorkshopAuthenticator.dbm_path == str(tmp_path / "passwords.dbm")
    assert c.WorkshopAuthenticator.homes_dir == str(tmp_path / "users")  # a name no folder holds is refused
    assert c.Authenticator.admin_users == {"instructor"}
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert sorted(roles) == ["board", "board-viewer", "idle-culler"]
    culler = roles["idle-culler"]
    assert sorted(culler["scopes"]) == sorted(["list:users", "read:users:activity", "read:servers", "delete:servers"])
    # The board reads records but can stop nothing; only the instructor may open it.
    assert "delete:servers" not in roles["board"]["scopes"] and roles["board"]["services"] == ["board"]
    assert roles["board-viewer"] == {
        "name": "board-viewer",
        "scopes": ["access:services!service=board"],
        "users": ["instructor"],
    }
    board = next(s for s in c.JupyterHub.services if s["name"] == "board")
    assert (
        board["url"] == "http://127.0.0.1:8003" and board["environment"]["BOARD_SERVERS_URL"] == "http://127.0.0.1:8000"
    )
    assert board["environment"]["BOARD_MISTAKES"] == str(tmp_path / "board-mistakes.json")
    assert c.ConfigurableHTTPProxy.command[0].endswith("tools/hub/node_modules/.bin/configurable-http-proxy")


def test_gpus_round_robin_with_preallocation_off_else_cpu_devices(monkeypatch, tmp_path):
    ns = load_config(monkeypatch, HUB_DIR=str(tmp_path))
    shares = [ns["kernel_environment"](user_id, ["0", "1", "2"]) for user_id in range(1, 7)]
    assert [s["CUDA_VISIBLE_DEVICES"] for s in shares] == ["1", "2", "0", "1", "2", "0"]
    assert all(s["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" for s in shares)
    cpu = ns["kernel_environment"](1, [])
    assert cpu["JAX_PLATFORMS"] == "cpu" and "CUDA_VISIBLE_DEVICES" not in cpu
    assert load_config(monkeypatch, HUB_DIR=str(tmp_path), HUB_GPUS="4,5")["GPUS"] == ["4", "5"]


def test_workspace_made_by_the_course_and_edits_kept(monkeypatch, tmp_path):
    ns = load_config(monkeypatch, HUB_DIR=str(tmp_path))
    folder = tmp_path / "users" / "dana" / "workspace"
    ns["make_workspace"](folder)
    lessons = sorted(p.name for p in folder.glob("*.ipynb"))
    assert lessons == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert (folder / "results").is_dir() and not list(folder.glob("*.py"))
    lesson = folder / "02_baseline.ipynb"
    notebook = json.loads(lesson.read_text())
    notebook["cells"][0]["source"] = ["my edits"]
    lesson.write_text(json.dumps(notebook))
    ns["make_workspace"](folder)  # the next start
    assert json.loads(lesson.read_text())["cells"][0]["source"] == ["my edits"]


def test_server_ports_never_handed_out_twice(monkeypatch, tmp_path):
    ns = load_config(monkeypatch, HUB_DIR=str(tmp_path))
    first = ns["free_port"](PORT, PORT + 2, set())
    assert ns["free_port"](PORT, PORT + 2, {first}) != first
    with pytest.raises(RuntimeError, match="no free port"):
        ns["free_port"](PORT, PORT, {PORT})


def prepared(tmp_path: Path, euid: int, **settings: str):
    env = {"HUB_DIR": str(tmp_path / "hub"), "HUB_PORT": str(PORT), **settings}
    found, lines, lock = launcher.prepare(env, euid=euid)
    lock.close()
    return found, lines


def test_without_root_learners_are_seated_only_once_the_instructor_confirms_the_shared_user(tmp_path):
    with pytest.raises(launcher.LaunchError) as refused:
        prepared(tmp_path, 1000)
    said = str(refused.value)
    assert said.startswith(launcher.SHARED_USER_WARNING) and "HUB_SHARED_USER_OK=1" in said and "as root" in said
    assert not (tmp_path / "hub").exists()  # nothing made before the refusal
    _, lines = prepared(tmp_path, 1000, HUB_SHARED_USER_OK="1")
    assert f"hub: {launcher.SHARED_USER_WARNING}" in lines


def test_passwords_are_kept_in_private_files_and_taken_out_of_the_environment(tmp_path):
    env, lines = prepared(
        tmp_path, 1000, HUB_SHARED_USER_OK="1", HUB_PASSWORD="given-password", HUB_ADMIN_PASSWORD="a" * 32
    )
    assert "HUB_PASSWORD" not in env and "HUB_ADMIN_PASSWORD" not in env
    hub = tmp_path / "hub"
    assert (hub / "password").read_text() == "given-password\n" and (
        hub / "admin-password"
    ).read_text() == "a" * 32 + "\n"
    for name in ("password", "admin-password", "address"):
        assert (hub / name).stat().st_mode & 0o777 == 0o600, name
    # The next start without them uses the kept ones.
    env, _ = prepared(tmp_path, 1000, HUB_SHARED_USER_OK="1")
    assert (hub / "password").read_text() == "given-password\n"


def test_the_address_learners_open_is_written_for_the_card(tmp_path):
    prepared(tmp_path, 1000, HUB_SHARED_USER_OK="1")
    assert (tmp_path / "hub" / "address").read_text() == f"http://127.0.0.1:{PORT}/\n"
    given = "https://hub.example.org/"
    _, lines = prepared(tmp_path, 1000, HUB_SHARED_USER_OK="1", HUB_PUBLIC_URL="https://hub.example.org")
    assert (tmp_path / "hub" / "address").read_text() == given + "\n"
    assert lines[0].startswith(f"hub: learners open {given} ") and not any("this machine only" in x for x in lines)
    with pytest.raises(launcher.LaunchError, match="not an address a browser opens"):
        prepared(tmp_path, 1000, HUB_SHARED_USER_OK="1", HUB_PUBLIC_URL="hub.example.org")


def test_an_open_address_with_a_certificate_is_named_as_the_certificate_names_it(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "other.example.org")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("room.example.org")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    url = launcher.public_url({"HUB_SSL_CERT": str(tmp_path / "c.pem")}, "0.0.0.0", 8443, True)
    assert url == "https://room.example.org:8443/"
    assert launcher.public_url({}, "10.0.0.5", 8000, False) == "http://10.0.0.5:8000/"


@pytest.mark.skipif(os.geteuid() != 0, reason="the hub's folder is prepared for separate users only as root")
def test_as_root_the_hubs_files_are_its_own_and_its_folder_only_enterable(tmp_path):
    import tempfile

    from hubprocess import open_the_way

    open_the_way([ROOT, Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix)])
    base = Path(tempfile.mkdtemp(prefix="hub-launch-test-"))
    try:
        os.chmod(base, 0o755)
        (base / "hub").mkdir()
        (base / "hub" / "jupyterhub.sqlite").write_text("from an older run")
        os.chmod(base / "hub" / "jupyterhub.sqlite", 0o644)
        prepared(base, 0)
        assert (base / "hub").stat().st_mode & 0o777 == 0o711
        assert (base / "hub" / "users").stat().st_mode & 0o777 == 0o711
        for entry in (base / "hub").iterdir():
            if entry.is_file():
                assert entry.stat().st_mode & 0o077 == 0, entry
        os.chmod(base, 0o700)  # the learners could not reach their homes: refused, with the folder named
        with pytest.raises(launcher.LaunchError, match=f"cannot enter {base}"):
            prepared(base, 0)
    finally:
        import shutil

        shutil.rmtree(base)


def test_folders_closed_to_other_users_are_found(tmp_path):
    (tmp_path / "open" / "inner").mkdir(parents=True)
    (tmp_path / "shut").mkdir()
    os.chmod(tmp_path / "shut", 0o700)
    os.chmod(tmp_path / "open", 0o711)
    found = launcher.closed_folders([tmp_path / "shut" / "x", tmp_path / "open" / "inner"])
    assert tmp_path / "shut" in found and tmp_path / "open" not in found
