"""The checkpointing Job's answer to a preemption and a lost pod, and docs/multihost.md's account of it.

deploy/multihost-checkpoint.yaml decides each pod's fate with its
podFailurePolicy; docs/multihost.md tells an instructor, in a table, which
endings retry, which count against backoffLimit and which fail the Job.
Here the rules are applied to the pods' possible endings the way the Job
controller applies them (pkg/controller/job/pod_failure_policy.go in
kubernetes/kubernetes: rules in order, the first match decides; an exit-code
rule looks only at terminated containers with a non-zero code; no match
counts), and the guide's table, grace period, checkpoint folder and figures
are read against the manifest and the package. No JAX is needed: the two
package modules read here import only the standard library.
"""

from __future__ import annotations

import re

import pytest
from infra_files import DEPLOY_DIR, ROOT, load_manifest

from dpcourse.checkpoints import interval
from dpcourse.multihost.preemption import PREEMPTED_EXIT_CODE

CHECKPOINT_MANIFEST = DEPLOY_DIR / "multihost-checkpoint.yaml"
GUIDE = ROOT / "docs" / "multihost.md"
WORKER_SOURCE = ROOT / "dpcourse" / "multihost" / "worker.py"
SECTION = "## A preemption and a lost pod"
COUNTED, IGNORED, FAILED = "Count", "Ignore", "FailJob"


def job_action(job: dict, exit_code: int, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a failed pod of ``job``: "Ignore", "FailJob" or "Count".

    The pod's one container (the worker) ended with ``exit_code``; the pod
    carries the condition types in ``conditions`` (status "True").
    """
    container = job["spec"]["template"]["spec"]["containers"][0]["name"]
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            if req.get("containerName", container) != container or exit_code == 0:
                continue
            inside = exit_code in req["values"]
            if inside == (req["operator"] == "In"):
                return rule["action"]
        elif any(p["status"] == "True" and p["type"] in conditions for p in rule.get("onPodConditions", [])):
            return rule["action"]
    return COUNTED


@pytest.fixture(scope="module")
def job() -> dict:
    (found,) = [d for d in load_manifest(CHECKPOINT_MANIFEST) if d["kind"] == "Job"]
    return found


@pytest.fixture(scope="module")
def section() -> str:
    text = GUIDE.read_text()
    assert SECTION in text, f"docs/multihost.md lacks the section {SECTION!r}"
    part = text[text.index(SECTION) :]
    return part[: part.index("\n## ", 1)]


ENDINGS = [
    # (what happened, exit code, pod conditions, what the Job must do)
    ("saved at the agreed preemption step, on the preempted node", PREEMPTED_EXIT_CODE, ("DisruptionTarget",), IGNORED),
    ("saved at the agreed preemption step, on a node that only followed", PREEMPTED_EXIT_CODE, (), IGNORED),
    ("killed at the end of the grace period on the preempted node", 137, ("DisruptionTarget",), IGNORED),
    ("drained or evicted while installing", 1, ("DisruptionTarget",), IGNORED),
    ("killed without notice (SIGKILL, out of memory)", 137, (), COUNTED),
    ("a crash", 1, (), COUNTED),
    ("aborted (SIGABRT: 128 + 6), a status no rule names", 134, (), COUNTED),
    ("a ref that does not exist, or a checkpoint folder it cannot use", 78, (), FAILED),
]


@pytest.mark.parametrize(("ending", "code", "conditions", "action"), ENDINGS, ids=[e[0] for e in ENDINGS])
def test_each_ending_gets_the_action_the_lesson_expects(job, ending, code, conditions, action):
    assert job_action(job, code, conditions) == action, ending


def test_the_retried_status_is_the_packages_preempted_exit_code(job):
    assert PREEMPTED_EXIT_CODE == 128 + 15
    (rule,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == IGNORED and "onExitCodes" in r]
    assert rule["onExitCodes"] == {"containerName": "worker", "operator": "In", "values": [PREEMPTED_EXIT_CODE]}
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy requires it"


def test_the_policy_model_reads_exit_code_rules_as_the_controller_does():
    rules = [{"action": FAILED, "onExitCodes": {"operator": "NotIn", "values": [5]}}]
    job = {"spec": {"podFailurePolicy": {"rules": rules}, "template": {"spec": {"containers": [{"name": "w"}]}}}}
    assert job_action(job, 7) == FAILED
    assert job_action(job, 5) == COUNTED
    # A container that exited 0 never matches an exit-code rule, even NotIn.
    assert job_action(job, 0) == COUNTED
    rules[0]["onExitCodes"]["containerName"] = "other"
    assert job_action(job, 7) == COUNTED


def _table(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_the_guides_table_is_the_jobs_policy(job, section):
    rows = _table(section)
    assert len(rows) == 4, rows
    for ending, recorded, rule, counts in rows:
        codes = [int(c) for c in re.findall(r"exit code (\d+)", recorded)]
        conditions = tuple(re.findall(r"`(DisruptionTarget)`", recorded))
        action = re.match(r"`(\w+)`|none", rule).group(1) or COUNTED
        if codes:
            assert len(codes) == 1, recorded
            assert job_action(job, codes[0], conditions) == action, ending
        elif conditions:
            assert job_action(job, 1, conditions) == action, ending
        else:
            assert "any other exit code" in recorded, recorded
            # Every status the row names in its first column, and one no rule names.
            for code in [int(c) for c in re.findall(r"\((\d+)\)", ending)] + [134]:
                assert job_action(job, code) == COUNTED, (ending, code)
        assert counts == {IGNORED: "no", COUNTED: "yes", FAILED: "(fails)"}[action], (ending, counts)
    policy_codes = {
        c for r in job["spec"]["podFailurePolicy"]["rules"] for c in r.get("onExitCodes", {}).get("values", [])
    }
    table_codes = {int(c) for row in rows for c in re.findall(r"exit code (\d+)", row[1])}
    assert policy_codes == table_codes


def test_the_guide_gives_the_manifests_grace_period_checkpoint_folder_and_save_interval(job, section):
    spec = job["spec"]["template"]["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    assert f"`terminationGracePeriodSeconds: {grace}`" in section
    assert grace <= interval.GKE_SPOT_POD_SHUTDOWN_S < interval.SPOT_NOTICE_S
    assert grace < interval.KUBERNETES_DEFAULT_GRACE_S and "default of 30 s" in section
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert f"`{env['CHECKPOINT_DIR']}`" in section
    assert f"`SAVE_EVERY` ({env['SAVE_EVERY']})" in section
    claim = [d for d in load_manifest(CHECKPOINT_MANIFEST) if d["kind"] == "PersistentVolumeClaim"][0]
    assert f"`{claim['metadata']['name']}`" in section
    assert f"exit code {PREEMPTED_EXIT_CODE}" in section.replace("**Exit code", "exit code")
    hours = job["spec"]["activeDeadlineSeconds"] / 3600
    assert f"`activeDeadlineSeconds` ({hours:g} hours)" in section


def test_the_guides_interval_example_is_the_modules(section):
    save = re.search(r"lesson 11's measured ([\d.]+) s save", section)
    mtbf = re.search(r"assumed MTBF of (\d+) h", section)
    tau = re.search(r"a save every (\d+) s of training", section)
    assert save and mtbf and tau, "the example's save, MTBF and interval must be in the guide"
    node = interval.gke_spot_l4(int(mtbf.group(1)) * 3600)
    assert float(save.group(1)) == round(node.save_s, 2)
    assert int(tau.group(1)) == round(node.optimal_interval_s())
    assert f"{node.restart_s / 60:g}-minute reinstall" in section


def test_the_header_and_the_guide_say_what_the_worker_does_on_sigterm(section):
    """Whether the GKE worker saves at the preemption step is read from its source, not assumed."""
    header = CHECKPOINT_MANIFEST.read_text().split("---", 1)[0]
    asks = "reached_preemption_sync_point" in WORKER_SOURCE.read_text()
    told_never = "the worker never asks multihost_utils.reached_preemption_sync_point" in header
    guide_never = "`dpcourse.multihost.worker` never asks" in section
    assert told_never == guide_never == (not asks), (
        "dpcourse/multihost/worker.py "
        + ("now asks" if asks else "does not ask")
        + " the preemption sync point: update the manifest's header (step 1) and the guide"
    )
    assert "exits with 143" in header and "exit code 143" in header
