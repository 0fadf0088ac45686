"""deploy/hub/config.yaml (Zero to JupyterHub on GKE), checked offline: the chart's schema, the profiles' pods, terraform.

- The values of the install command as docs/gke.md gives it (its --values
  files, --set-file, --set-string and --set, read from the page), merged over
  the chart's own values.yaml, validate against its values.schema.yaml
  (../shared/vendor/z2jh-chart-4.4.0, the pinned version), alone and with the
  HTTPS options the page adds; no password and no token of the hub's reaches
  a learner's pod.
- KubeSpawner (the chart's spawner) renders each profile's pod with a fake
  kubeconfig: image, resources, GPUs and the GKE sharing labels, tolerations,
  the workspace volume. The chart maps `singleuser` to KubeSpawner's settings
  in its own jupyterhub_config.py; `kubespawner_config` below does the same
  for the keys the course sets.
- The node pools, GPU counts and clients per GPU agree with terraform/.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import importlib.util
import os
import re
import shlex
import sys
import types
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_VERSION = "4.4.0"
CHART = ROOT.parent / "shared" / "vendor" / f"z2jh-chart-{CHART_VERSION}"
CONFIG = ROOT / "deploy" / "hub" / "config.yaml"
HTTPS = ROOT / "deploy" / "hub" / "https.yaml"
GKE_DOC = ROOT / "docs" / "gke.md"
# What the page's shell variables stand for when the command runs: recognisable in any rendered object.
SHELL_VARIABLES = {
    "WORKSHOP_PASSWORD": "workshop-pw-sentinel-1f3a",
    "INSTRUCTOR_PASSWORD": "instructor-pw-sentinel-" * 2,
}
PROFILES = {"cpu": 0, "shared-l4": 1, "two-l4": 2}


def chart_file(name: str) -> Path:
    path = CHART / name
    if not path.is_file():
        pytest.skip(f"{path} is missing: the chart's {name} (see ../shared/vendor/README.md) is needed for this check")
    return path


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base`` the way helm merges --values files (maps merge, the rest replaces)."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def documented_command(https: bool = False) -> list[str]:
    """The helm install command of docs/gke.md as words, its shell variables filled in; with ``https``, the options
    the page adds for a room (the inline ``--values deploy/hub/https.yaml ...``) appended."""
    text = GKE_DOC.read_text()
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "helm upgrade --install" in b]
    assert len(blocks) == 1, "docs/gke.md holds the one install command"
    (line,) = [x for x in blocks[0].replace("\\\n", " ").splitlines() if "helm upgrade --install" in x]
    words = shlex.split(line)
    if https:
        (extra,) = re.findall(r"`(--values deploy/hub/https\.yaml[^`]*)`", re.sub(r"\s*\n\s*", " ", text))
        words += shlex.split(extra)
    return [re.sub(r"\$(\w+)", lambda m: SHELL_VARIABLES.get(m[1], m[0]), w) for w in words]


def set_value(values: dict, key: str, value) -> None:
    """helm's ``--set a.b[0]=v``: ``v`` at that path of ``values``, maps and lists made on the way."""
    parts = [p for piece in key.split(".") for p in re.split(r"\[(\d+)\]", piece) if p != ""]
    here = values
    for part, after in zip(parts, [*parts[1:], None]):
        index = int(part) if part.isdigit() else part
        if after is None:
            if isinstance(here, list):
                here.extend([None] * (index + 1 - len(here)))
            here[index] = value
            return
        fresh = [] if after.isdigit() else {}
        if isinstance(here, list):
            here.extend([None] * (index + 1 - len(here)))
            here[index] = here[index] if here[index] is not None else fresh
        else:
            here.setdefault(index, fresh)
        here = here[index]


def values_of(words: list[str]) -> dict:
    """The values helm installs for the command ``words`` (its --values, --set-file, --set-string, --set, in order)."""
    values: dict = {}
    flags = iter(words)
    for word in flags:
        if word in ("--values", "-f"):
            values = deep_merge(values, load(ROOT / next(flags)))
        elif word in ("--set-file", "--set-string", "--set"):
            key, _, given = next(flags).partition("=")
            if word == "--set-file":
                given = (ROOT / given).read_text()
            elif word == "--set":
                given = yaml.safe_load(given)  # helm types --set values (true, 3); --set-string keeps text
            set_value(values, key, given)
    return values


def installed(https: bool = False) -> dict:
    """The values the documented install command gives helm (with the room's HTTPS options when ``https``)."""
    return values_of(documented_command(https))


def validate(values: dict) -> list[str]:
    schema = load(chart_file("values.schema.yaml"))
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]


def test_config_validates_against_the_chart_schema_merged_over_its_defaults():
    defaults = load(chart_file("values.yaml"))
    assert validate(deep_merge(defaults, installed())) == []
    assert validate(deep_merge(defaults, installed(https=True))) == []
    # Without the board's and the sign-in's sources (an install command missing --set-file) helm refuses the values.
    errors = validate(deep_merge(defaults, load(CONFIG)))
    assert any(e.startswith("hub.extraFiles.board") for e in errors)
    assert any(e.startswith("hub.extraFiles.signin") for e in errors)


def test_the_schema_check_can_fail():
    defaults = load(chart_file("values.yaml"))
    broken = deep_merge(load(CONFIG), {"singleuser": {"storage": {"capasity": "10Gi"}}, "cull": {"timeout": "1h"}})
    errors = validate(deep_merge(defaults, broken))
    assert any("capasity" in e for e in errors) and any(e.startswith("cull.timeout") for e in errors), errors


def test_the_install_command_is_one_in_docs_gke_with_the_pinned_chart_and_the_board():
    words = documented_command()
    assert words[:5] == ["helm", "upgrade", "--install", "course", "jupyterhub/jupyterhub"]
    assert words[words.index("--version") + 1] == CHART_VERSION
    assert words[words.index("--set-file") + 1] == "hub.extraFiles.board.stringData=hub/board.py"
    https = documented_command(https=True)
    assert https[https.index("--values", words.index("--values") + 1) + 1] == "deploy/hub/https.yaml"
    # No second copy to drift: the files it installs and the other guides point to the page.
    for path in (CONFIG, HTTPS, ROOT / "docs" / "instructor.md", ROOT / "README.md"):
        assert "helm upgrade" not in path.read_text(), f"{path.name} repeats the install command: point to docs/gke.md"


def test_the_documented_values_check_can_fail():
    values = values_of([*documented_command(), "--set", "cull.timeout=1h", "--set", "proxy.https.hosts[0]=3"])
    assert values["proxy"]["https"]["hosts"] == [3]
    errors = validate(deep_merge(load(chart_file("values.yaml")), values))
    assert any(e.startswith("cull.timeout") for e in errors), errors


def test_no_password_and_no_token_of_the_hubs_reaches_a_learners_pod(pods):
    values = installed(https=True)
    signin = values["hub"]["config"]["WorkshopAuthenticator"]
    # The command gives both passwords to the hub's config (the chart keeps it in the hub's own Secret) ...
    assert {signin["workshop_password"], signin["admin_password"]} == set(SHELL_VARIABLES.values())
    # ... and the board's token is the chart's to make (kept there too): none is given to it here.
    assert not any("token" in key.lower() for key in values["hub"]["services"]["board"])
    learners = yaml.safe_dump(values["singleuser"])
    assert not any(secret in learners for secret in SHELL_VARIABLES.values())
    for slug, (_, pod) in pods.items():
        rendered = str(pod.to_dict())
        assert not any(secret in rendered for secret in SHELL_VARIABLES.values()), slug
        main = container(pod)
        assert not main.env_from, f"{slug}: a learner's pod takes environment from a Secret or ConfigMap"
        from_elsewhere = [e.name for e in main.env if e.value_from is not None]
        assert from_elsewhere == [], f"{slug}: {from_elsewhere} come from a Secret"
        volumes = [v if isinstance(v, dict) else v.to_dict() for v in pod.spec.volumes]
        assert not any(v.get("secret") for v in volumes), f"{slug}: a Secret mounted in a learner's pod"


def test_never_an_open_http_endpoint():
    config, https = load(CONFIG), load(HTTPS)
    assert config["proxy"]["service"]["type"] == "ClusterIP", "the default is port-forward only"
    assert https["proxy"]["https"]["enabled"] is True and https["proxy"]["https"]["type"] == "letsencrypt"
    assert config["hub"]["config"]["JupyterHub"]["authenticator_class"] == "signin.WorkshopAuthenticator"
    assert "_password" not in str(config), "the passwords are given at install time, never committed"


def kubespawner_config(values: dict):
    """KubeSpawner's settings for the chart's ``singleuser`` values (as the chart's hub maps them)."""
    from traitlets.config import Config

    single = values["singleuser"]
    c = Config()
    k = c.KubeSpawner
    k.image = f"{single['image']['name']}:{single['image']['tag']}"
    k.image_pull_policy = single["image"].get("pullPolicy") or "IfNotPresent"
    k.uid = single["uid"]
    k.fs_gid = single["fsGid"]
    k.allow_privilege_escalation = single["allowPrivilegeEscalation"]
    k.cmd = [single["cmd"]]
    k.default_url = single["defaultUrl"]
    k.cpu_guarantee = float(single["cpu"]["guarantee"])
    k.cpu_limit = float(single["cpu"]["limit"])
    k.mem_guarantee = single["memory"]["guarantee"]
    k.mem_limit = single["memory"]["limit"]
    k.node_selector = single["nodeSelector"]
    k.environment = single["extraEnv"]
    k.lifecycle_hooks = single["lifecycleHooks"]
    k.profile_list = single["profileList"]
    storage = single["storage"]
    assert storage["type"] == "dynamic"
    k.storage_pvc_ensure = True
    k.pvc_name_template = "claim-{user_server}"
    k.storage_capacity = storage["capacity"]
    k.storage_class = storage["dynamic"]["storageClass"]
    k.storage_access_modes = storage["dynamic"]["storageAccessModes"]
    volume = storage["dynamic"].get("volumeNameTemplate", "home")
    k.volumes = [{"name": volume, "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    k.volume_mounts = [{"mountPath": storage["homeMountPath"], "name": volume}]
    return c


@pytest.fixture(scope="module")
def fake_kubeconfig(tmp_path_factory):
    """A kubeconfig naming a cluster that is never contacted (KubeSpawner reads one at start)."""
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "fake", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "course"}}],
                "current-context": "fake",
            }
        )
    )
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    yield path
    if old is None:
        os.environ.pop("KUBECONFIG", None)
    else:
        os.environ["KUBECONFIG"] = old


def pod_for(profile: str | None, values: dict):
    from kubespawner import KubeSpawner

    async def render():
        spawner = KubeSpawner(config=kubespawner_config(values), _mock=True)
        spawner.user_options = {"profile": profile} if profile else {}
        await spawner.load_user_options()
        return spawner.get_pvc_manifest(), await spawner.get_pod_manifest()

    # In a thread of its own: a session's Playwright browser (test_card, the room tests) keeps an
    # event loop running in this one, where asyncio.run refuses.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, render()).result()


@pytest.fixture(scope="module")
def pods(fake_kubeconfig):
    values = deep_merge(load(chart_file("values.yaml")), installed())
    return {slug: pod_for(slug, values) for slug in PROFILES} | {None: pod_for(None, values)}


def container(pod):
    (main,) = [c for c in pod.spec.containers if c.name == "notebook"]
    return main


def env_of(pod) -> dict:
    return {e.name: e.value for e in container(pod).env}


def test_every_profile_runs_the_course_image_with_the_workspace_volume(pods):
    config = load(CONFIG)
    image = f"{config['singleuser']['image']['name']}:{config['singleuser']['image']['tag']}"
    for slug, (pvc, pod) in pods.items():
        assert container(pod).image == image, slug
        (mount,) = [m for m in container(pod).volume_mounts if m.mount_path == "/home/jovyan"]
        volumes = [v if isinstance(v, dict) else v.to_dict() for v in pod.spec.volumes]
        (volume,) = [v for v in volumes if v["name"] == mount.name]
        claim = volume.get("persistentVolumeClaim") or volume.get("persistent_volume_claim")
        assert (claim.get("claimName") or claim.get("claim_name")) == pvc.metadata.name
        assert pvc.spec.resources.requests["storage"] == "10Gi"
        assert pvc.spec.storage_class_name == "standard-rwo"
        context = container(pod).security_context
        context = context if isinstance(context, dict) else context.to_dict()
        assert context.get("allowPrivilegeEscalation", context.get("allow_privilege_escalation")) is False
        pod_context = pod.spec.security_context
        pod_context = pod_context if isinstance(pod_context, dict) else pod_context.to_dict()
        assert pod_context.get("fsGroup", pod_context.get("fs_group")) == 100
        hook = container(pod).lifecycle
        hook = hook if isinstance(hook, dict) else hook.to_dict()
        command = (hook.get("postStart") or hook["post_start"])["exec"]["command"]
        assert command == ["python", "-m", "coursetools", "workspace", "init", "--dir", "/home/jovyan/workspace"]


def test_cpu_profile_is_the_default_with_no_gpu(pods):
    for slug in ("cpu", None):  # None: no choice made, the default applies
        _, pod = pods[slug]
        resources = container(pod).resources
        assert "nvidia.com/gpu" not in (resources.limits or {})
        assert resources.requests["cpu"] == 2 and resources.limits["memory"] == 8 * 2**30  # "8G": KubeSpawner reads GiB
        assert pod.spec.node_selector == {"cloud.google.com/gke-nodepool": "cpu-pool"}
        assert env_of(pod)["JAX_PLATFORMS"] == "cpu"
        assert not [t for t in pod.spec.tolerations or [] if t.key == "nvidia.com/gpu"]


def tfvar_default(name: str):
    text = (ROOT / "terraform" / "variables.tf").read_text()
    block = re.search(rf'variable "{name}" \{{(.*?)\n\}}', text, re.S).group(1)
    return yaml.safe_load(re.search(r"^\s*default\s*=\s*(.+)$", block, re.M).group(1))


def test_shared_l4_profile_asks_one_time_shared_gpu_without_preallocation(pods):
    _, pod = pods["shared-l4"]
    resources = container(pod).resources
    assert resources.limits["nvidia.com/gpu"] == "1", "a time-shared container may ask for at most one GPU"
    assert pod.spec.node_selector == {
        "cloud.google.com/gke-nodepool": "gpu-shared-pool",
        "cloud.google.com/gke-gpu-sharing-strategy": tfvar_default("gpu_sharing_strategy").lower().replace("_", "-"),
        "cloud.google.com/gke-max-shared-clients-per-gpu": str(tfvar_default("max_shared_clients_per_gpu")),
    }
    assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in pod.spec.tolerations)
    env = env_of(pod)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert "JAX_PLATFORMS" not in env


def test_two_l4_profile_asks_the_whole_gpu_node(pods):
    _, pod = pods["two-l4"]
    resources = container(pod).resources
    assert resources.limits["nvidia.com/gpu"] == str(tfvar_default("gpu_count")) == "2"
    assert pod.spec.node_selector == {"cloud.google.com/gke-nodepool": "gpu-pool"}
    assert any(t.key == "nvidia.com/gpu" for t in pod.spec.tolerations)
    assert env_of(pod)["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"


def test_an_unknown_profile_is_refused(fake_kubeconfig):
    values = deep_merge(load(chart_file("values.yaml")), installed())
    with pytest.raises(ValueError):
        pod_for("eight-h100", values)


def test_node_pools_named_in_the_config_exist_in_terraform():
    main = (ROOT / "terraform" / "main.tf").read_text()
    text = CONFIG.read_text()
    for pool in set(re.findall(r"cloud.google.com/gke-nodepool: ([\w-]+)", text)):
        assert f'name               = "{pool}"' in main or f'name       = "{pool}"' in main, pool


def board_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("board", ROOT / "hub" / "board.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_board_service_runs_the_mounted_file_on_the_port_the_proxy_may_reach():
    hub = load(CONFIG)["hub"]
    service = hub["services"]["board"]
    assert service["command"][-1] == hub["extraFiles"]["board"]["mountPath"]
    port = int(service["url"].rsplit(":", 1)[1])
    assert service["url"].startswith("http://hub:")
    assert {"name": "board", "port": port, "targetPort": port} in hub["service"]["extraPorts"]
    (rule,) = hub["networkPolicy"]["ingress"]
    assert rule["ports"] == [{"port": port}]
    assert rule["from"][0]["podSelector"]["matchLabels"]["component"] == "proxy"
    assert service["environment"]["BOARD_BIND"] == "0.0.0.0"  # the url's host is the Service's address
    files = installed()["hub"]["extraFiles"]
    assert files["board"]["stringData"] == (ROOT / "hub" / "board.py").read_text()
    # board.py imports records.py from its own folder.
    assert files["records"]["stringData"] == (ROOT / "hub" / "records.py").read_text()
    assert Path(files["records"]["mountPath"]).parent == Path(files["board"]["mountPath"]).parent


def test_only_the_instructor_holds_the_boards_viewer_role_and_the_scopes_are_make_hubs():
    board = board_module()
    hub = load(CONFIG)["hub"]
    roles = hub["loadRoles"]
    assert roles["board-viewer"] == {
        "scopes": board.VIEWER_SCOPES,
        "users": hub["config"]["Authenticator"]["admin_users"],
    }
    assert roles["board"] == {"scopes": board.SERVICE_SCOPES, "services": ["board"]}


def test_the_board_reads_records_through_the_proxy_with_and_without_https():
    plain = load(CONFIG)
    assert plain["hub"]["services"]["board"]["environment"]["BOARD_SERVERS_URL"] == "http://proxy-public"
    merged = installed(https=True)
    assert merged["hub"]["services"]["board"]["environment"]["BOARD_SERVERS_URL"] == "http://proxy-http:8000"
    assert merged["hub"]["services"]["board"]["command"] == plain["hub"]["services"]["board"]["command"]
    assert not validate(deep_merge(load(chart_file("values.yaml")), merged))


def test_learners_record_progress_where_the_board_reads_it():
    single = load(CONFIG)["singleuser"]
    workspace = single["lifecycleHooks"]["postStart"]["exec"]["command"][-1]
    assert single["extraEnv"]["DPCOURSE_WORKSPACE"] == workspace == "/home/jovyan/workspace"


def test_the_gpu_sharing_is_set_in_terraform_and_the_hub_and_read_everywhere_else(monkeypatch):
    strategy, clients = tfvar_default("gpu_sharing_strategy"), tfvar_default("max_shared_clients_per_gpu")
    example = (ROOT / "terraform" / "terraform.tfvars.example").read_text()
    assert not re.search(r"^(gpu_sharing_strategy|max_shared_clients_per_gpu)\s*=", example, re.M), (
        "terraform.tfvars.example repeats the GPU sharing: it is set in variables.tf and deploy/hub/config.yaml"
    )
    spec = importlib.util.spec_from_file_location("plan_workshop", ROOT / "tools" / "plan_workshop.py")
    plan = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, plan)  # its dataclasses look their module up there
    spec.loader.exec_module(plan)
    assert plan.gpu_sharing() == (strategy.lower().replace("_", "-"), clients)
    plan_text = (ROOT / "tools" / "plan_workshop.py").read_text()
    assert not re.search(r"^CLIENTS_PER_GPU = \d", plan_text, re.M)


def test_a_learners_terminal_on_gke_finds_the_course_with_python():
    """The card's `python -m coursetools ...` in a terminal of the course image.

    A terminal there is a login shell (jupyter_server_terminals adds -l), whose
    /etc/profile (Debian's base-files) sets PATH to /usr/local/bin:/usr/bin:/bin
    for a user who is not root; the python image's interpreter is
    /usr/local/bin/python, so the course must be installed into it, not into a
    virtual environment that PATH would miss.
    """
    dockerfile = (ROOT / "deploy" / "hub" / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert base.startswith("python:") and "-slim-bookworm" in base
    assert "venv" not in dockerfile and not re.search(r"^ENV PATH", dockerfile, re.M)
    assert "pip install --no-deps -e ." in dockerfile and "coursetools-repo.pth" in dockerfile
    assert "COPY coursetools ./coursetools" in dockerfile


def test_on_gke_a_taken_name_is_refused_with_the_workshop_password(tmp_path, monkeypatch):
    """The two-browser case on the values helm installs: the hub's sign-in as the chart would load it."""
    from traitlets.config import Config

    hub = installed(https=True)["hub"]
    assert hub["config"]["JupyterHub"]["authenticator_class"] == "signin.WorkshopAuthenticator"
    mounted = hub["extraFiles"]["signin"]
    # The chart puts the folder of its jupyterhub_config.py on the hub's Python path: `signin` imports from there.
    assert mounted["mountPath"] == "/usr/local/etc/jupyterhub/signin.py"
    assert mounted["stringData"] == (ROOT / "hub" / "signin.py").read_text()
    module = types.ModuleType("signin")
    exec(compile(mounted["stringData"], mounted["mountPath"], "exec"), module.__dict__)
    fast = module.bcrypt.gensalt
    monkeypatch.setattr(module.bcrypt, "gensalt", lambda: fast(4))  # the fewest rounds: the hashes, not their cost
    config = Config(copy.deepcopy(hub["config"]))
    assert config.WorkshopAuthenticator.dbm_path.startswith("/srv/jupyterhub/")  # the hub's own disk
    config.WorkshopAuthenticator.dbm_path = str(tmp_path / "passwords.dbm")
    auth = module.WorkshopAuthenticator(config=config)
    workshop, instructor = SHELL_VARIABLES["WORKSHOP_PASSWORD"], SHELL_VARIABLES["INSTRUCTOR_PASSWORD"]

    def sign_in(name: str, password: str, second_field: str = "") -> str | None:
        form = {"username": name, "password": password, "otp": second_field}
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # beside Playwright's loop
            return pool.submit(asyncio.run, auth.authenticate(types.SimpleNamespace(), form)).result()

    # The rules themselves: tests/hub/test_signin.py; here, that the chart's values reach them.
    assert sign_in("eli", "eli's own password", workshop) == "eli" and sign_in("Eli", workshop, workshop) is None
    assert sign_in("instructor", instructor) == "instructor"
    assert hub["config"]["KubeSpawner"]["delete_pvc"] is False  # "Delete user" forgets a password, not a disk
