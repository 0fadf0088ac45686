"""Static checks of terraform/: versions, variables, validation rules, resources, outputs.

The validation rules are evaluated, not just found: hcl_eval runs each
``condition`` the way ``terraform plan`` would, for the cases in
VALIDATION_CASES. Where a terraform binary exists, the same cases also go
through Terraform itself (on a copy of variables.tf and locals.tf, which need
no provider), and both must agree.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hcl_eval import Evaluator, parse_tfvars, validation_failures, variable_values
from infra_files import TERRAFORM_DIR, terraform_binary, terraform_env

PROJECT = {"project_id": "dp-course-workshop"}

# (id, variable values over the defaults, variables whose validation must fail)
VALIDATION_CASES = [
    ("defaults", {}, set()),
    ("gpu_count 3 on g2-standard-24", {"gpu_count": 3}, {"gpu_count"}),
    ("gpu_count 4 on g2-standard-24", {"gpu_count": 4}, {"gpu_count"}),
    ("4-GPU variant", {"machine_type": "g2-standard-48", "gpu_count": 4}, set()),
    ("g2-standard-48 left at 2 GPUs", {"machine_type": "g2-standard-48"}, {"gpu_count"}),
    ("8-GPU machine", {"machine_type": "g2-standard-96", "gpu_count": 8}, set()),
    ("g2-standard-32 has one GPU", {"machine_type": "g2-standard-32", "gpu_count": 1}, set()),
    ("g2-standard-32 with 2 GPUs", {"machine_type": "g2-standard-32", "gpu_count": 2}, {"gpu_count"}),
    ("not a G2 machine", {"machine_type": "n1-standard-8", "gpu_count": 2}, {"machine_type", "gpu_count"}),
    ("T4 instead of L4", {"gpu_type": "nvidia-tesla-t4"}, {"gpu_type"}),
    ("zone outside region", {"zone": "europe-west4-a"}, {"zone"}),
    ("zone and region together", {"region": "europe-west4", "zone": "europe-west4-b"}, set()),
    ("no GPU nodes", {"gpu_node_count": 0}, {"gpu_node_count"}),
    ("fractional node count", {"gpu_node_count": 1.5}, {"gpu_node_count"}),
    ("two nodes (multi-host)", {"gpu_node_count": 2}, set()),
    ("a v5e-16 slice", {"tpu_topology": "4x4", "tpu_spot": True}, set()),
    ("2x2 is one host, no slice", {"tpu_topology": "2x2"}, {"tpu_topology"}),
    ("one client per GPU is no sharing", {"max_shared_clients_per_gpu": 1}, {"max_shared_clients_per_gpu"}),
    ("more clients than GKE allows", {"max_shared_clients_per_gpu": 49}, {"max_shared_clients_per_gpu"}),
    ("MPS sharing", {"gpu_sharing_strategy": "MPS", "max_shared_clients_per_gpu": 8}, set()),
    ("L4 has no MIG", {"gpu_sharing_strategy": "MIG"}, {"gpu_sharing_strategy"}),
    ("a GPU machine for the CPU pool", {"cpu_machine_type": "g2-standard-8"}, {"cpu_machine_type"}),
    ("CPU pool max below min", {"cpu_min_node_count": 3, "cpu_max_node_count": 2}, {"cpu_max_node_count"}),
    ("no CPU node for the hub", {"cpu_min_node_count": 0}, {"cpu_min_node_count"}),
    ("shared pool of three nodes", {"shared_gpu_max_node_count": 3}, set()),
    ("shared pool on a CPU machine", {"shared_gpu_machine_type": "e2-standard-8"}, {"shared_gpu_machine_type"}),
    ("driver installation disabled", {"gpu_driver_version": "INSTALLATION_DISABLED"}, {"gpu_driver_version"}),
    ("latest driver", {"gpu_driver_version": "LATEST"}, set()),
    ("project name instead of ID", {"project_id": "My Project"}, {"project_id"}),
    ("cluster name too long", {"cluster_name": "a-very-long-workshop-cluster-name"}, {"cluster_name"}),
    ("cluster name with capitals", {"cluster_name": "JaxCourse"}, {"cluster_name"}),
    ("small boot disk", {"disk_size_gb": 20}, {"disk_size_gb"}),
    ("unknown release channel", {"release_channel": "EXTENDED-ISH"}, {"release_channel"}),
    (
        "authorized network",
        {"control_plane_authorized_cidrs": [{"cidr_block": "203.0.113.7/32", "display_name": "instructor"}]},
        set(),
    ),
    (
        "authorized network open to all",
        {"control_plane_authorized_cidrs": [{"cidr_block": "0.0.0.0/0", "display_name": "all"}]},
        {"control_plane_authorized_cidrs"},
    ),
    (
        "authorized network not a CIDR",
        {"control_plane_authorized_cidrs": [{"cidr_block": "instructor-laptop", "display_name": "x"}]},
        {"control_plane_authorized_cidrs"},
    ),
]


def test_versions_have_lower_and_upper_bounds(tf):
    (block,) = tf["versions.tf"]["terraform"]
    assert re.fullmatch(r">= 1\.(9|\d\d).*, < 2\.0", block["required_version"]), (
        "required_version needs >= 1.9 (variable validation refers to other variables) and an upper bound"
    )
    (providers,) = block["required_providers"]
    google = providers["google"]
    assert google["source"] == "hashicorp/google"
    lower, upper = (part.strip() for part in google["version"].split(","))
    assert lower.startswith(">=") and upper.startswith("<"), google["version"]


def test_only_project_id_is_required(tf_module):
    required = [name for name, block in tf_module.variables.items() if "default" not in block.attributes]
    assert required == ["project_id"]


def test_every_variable_has_type_and_description(tf):
    for entry in tf["variables.tf"]["variable"]:
        ((name, body),) = entry.items()
        assert body.get("type"), f"variable {name} has no type"
        assert len(body.get("description", "")) > 20, f"variable {name} needs a description that says something"


def test_defaults(tf_module):
    values = variable_values(tf_module, PROJECT)
    assert values["machine_type"] == "g2-standard-24"
    assert values["gpu_type"] == "nvidia-l4"
    assert values["gpu_count"] == 2
    assert values["gpu_node_count"] == 1
    assert values["gpu_driver_version"] in ("DEFAULT", "LATEST")
    assert values["deletion_protection"] is False, "a workshop cluster must be removable by terraform destroy"
    assert values["spot"] is False
    assert values["zone"].startswith(values["region"] + "-")


def test_deletion_protection_default_explains_why(tf_module):
    source = (TERRAFORM_DIR / "variables.tf").read_text()
    block = source[source.index('variable "deletion_protection"') :]
    block = block[: block.index("\n}\n")]
    assert "default = false" in re.sub(r"\s+", " ", block)
    assert "terraform destroy" in block and "true" in block, (
        "the comment beside the default must say that the provider defaults to true and destroy then fails"
    )


def test_every_variable_with_a_fixed_set_of_values_is_validated(tf_module):
    for name in ("project_id", "zone", "machine_type", "gpu_type", "gpu_count", "gpu_node_count", "gpu_driver_version"):
        assert tf_module.variables[name].nested("validation"), f"variable {name} has no validation rule"


@pytest.mark.parametrize("case_id, overrides, failing", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
def test_validation_rules(tf_module, case_id, overrides, failing):
    failures = validation_failures(tf_module, {**PROJECT, **overrides})
    assert set(failures) == failing, failures


def test_gpu_count_message_says_what_to_set(tf_module):
    failures = validation_failures(tf_module, {**PROJECT, "gpu_count": 3})
    (message,) = failures["gpu_count"]
    assert "set gpu_count = 2 for g2-standard-24" in message
    failures = validation_failures(tf_module, {**PROJECT, "machine_type": "g2-standard-48"})
    (message,) = failures["gpu_count"]
    assert "set gpu_count = 4 for g2-standard-48" in message


def test_gpu_table_covers_the_g2_series(tf_module):
    table = Evaluator({}, tf_module.local_expressions).local("g2_gpus_per_machine_type")
    # Compute Engine's G2 table: 1 GPU up to g2-standard-16 and on -32; 2, 4, 8 on -24, -48, -96.
    assert table == {
        "g2-standard-4": 1,
        "g2-standard-8": 1,
        "g2-standard-12": 1,
        "g2-standard-16": 1,
        "g2-standard-24": 2,
        "g2-standard-32": 1,
        "g2-standard-48": 4,
        "g2-standard-96": 8,
    }


def test_tfvars_example_is_valid_and_matches_the_defaults(tf_module):
    example = parse_tfvars(TERRAFORM_DIR / "terraform.tfvars.example")
    values = {name: Evaluator({}, {}).eval(node) for name, node in example.items()}
    assert set(values) <= set(tf_module.variables), (
        f"unknown variables in the example: {set(values) - set(tf_module.variables)}"
    )
    assert "project_id" in values
    assert validation_failures(tf_module, values) == {}
    defaults = variable_values(tf_module, {"project_id": values["project_id"]})
    drift = {k: (v, defaults[k]) for k, v in values.items() if k != "project_id" and v != defaults[k]}
    assert not drift, f"the example shows values other than the defaults (example, default): {drift}"


def _resource(tf, resource_type, name):
    for entry in tf["main.tf"]["resource"]:
        if resource_type in entry and name in entry[resource_type]:
            return entry[resource_type][name]
    raise AssertionError(f"no resource {resource_type}.{name} in main.tf")


def test_apis_stay_enabled_on_destroy(tf, tf_module):
    apis = _resource(tf, "google_project_service", "apis")
    assert apis["disable_on_destroy"] is False
    assert apis["for_each"] == "${toset(local.required_apis)}"
    required = Evaluator({}, tf_module.local_expressions).local("required_apis")
    for service in ("container", "compute", "iam", "cloudresourcemanager", "logging", "monitoring"):
        assert f"{service}.googleapis.com" in required


def test_network_is_dedicated_and_vpc_native(tf):
    vpc = _resource(tf, "google_compute_network", "vpc")
    assert vpc["auto_create_subnetworks"] is False
    subnet = _resource(tf, "google_compute_subnetwork", "nodes")
    assert subnet["private_ip_google_access"] is True
    ranges = {r["range_name"] for r in subnet["secondary_ip_range"]}
    assert ranges == {"pods", "services"}
    cluster = _resource(tf, "google_container_cluster", "course")
    (policy,) = cluster["ip_allocation_policy"]
    assert policy == {"cluster_secondary_range_name": "pods", "services_secondary_range_name": "services"}


def test_cluster_settings(tf):
    cluster = _resource(tf, "google_container_cluster", "course")
    assert cluster["remove_default_node_pool"] is True
    assert cluster["initial_node_count"] == 1
    assert cluster["deletion_protection"] == "${var.deletion_protection}"
    assert cluster["workload_identity_config"] == [{"workload_pool": "${var.project_id}.svc.id.goog"}]
    assert cluster["release_channel"] == [{"channel": "${var.release_channel}"}]
    assert cluster["enable_shielded_nodes"] is True
    assert cluster["resource_labels"] == "${local.labels}"
    assert cluster["location"] == "${var.zone}"


def test_gpu_node_pool(tf):
    pool = _resource(tf, "google_container_node_pool", "gpu")
    assert pool["node_count"] == "${var.gpu_node_count}"
    assert pool["management"] == [{"auto_repair": True, "auto_upgrade": True}]
    (node,) = pool["node_config"]
    assert node["machine_type"] == "${var.machine_type}"
    assert node["service_account"] == "${google_service_account.nodes.email}"
    assert node["workload_metadata_config"] == [{"mode": "GKE_METADATA"}]
    assert node["shielded_instance_config"] == [{"enable_secure_boot": True, "enable_integrity_monitoring": True}]
    assert node["disk_size_gb"] == "${var.disk_size_gb}"
    (accelerator,) = node["guest_accelerator"]
    assert accelerator["type"] == "${var.gpu_type}"
    assert accelerator["count"] == "${var.gpu_count}"
    (driver,) = accelerator["gpu_driver_installation_config"]
    assert driver["gpu_driver_version"] == "${var.gpu_driver_version}", (
        "without GKE's driver installation, GPU pods wait forever for a driver"
    )


def test_node_service_account_is_least_privilege(tf):
    roles = []
    for entry in tf["main.tf"]["resource"]:
        for body in entry.get("google_project_iam_member", {}).values():
            if "google_service_account.nodes" in body["member"]:
                roles.append(body["role"])
    assert roles == ["roles/container.defaultNodeServiceAccount"]


def test_outputs(tf):
    outputs = {name: body for entry in tf["outputs.tf"]["output"] for name, body in entry.items()}
    for name in ("cluster_name", "zone", "get_credentials_command", "gpu_count", "project_id"):
        assert name in outputs, f"output {name} missing"
        assert outputs[name].get("description"), f"output {name} has no description"
    command = outputs["get_credentials_command"]["value"]
    assert command == (
        "gcloud container clusters get-credentials ${google_container_cluster.course.name}"
        " --zone ${google_container_cluster.course.location} --project ${var.project_id}"
    )


def test_terraform_fmt():
    binary = terraform_binary()
    if binary is None:
        pytest.skip(
            "no terraform binary on PATH: formatting is checked where one is installed (make infra-test on a machine with terraform)"
        )
    result = subprocess.run(
        [binary, "fmt", "-check", "-diff", "-recursive", str(TERRAFORM_DIR)],
        capture_output=True,
        text=True,
        env=terraform_env(),
        timeout=120,
    )
    assert result.returncode == 0, f"terraform fmt would change files:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def variables_only_workdir(tmp_path_factory) -> Path:
    """variables.tf and locals.tf alone, initialised: they need no provider, so plan runs offline."""
    binary = terraform_binary()
    if binary is None:
        pytest.skip("no terraform binary on PATH: the validation cases were checked by hcl_eval only")
    workdir = tmp_path_factory.mktemp("tf-variables")
    for name in ("variables.tf", "locals.tf"):
        shutil.copy(TERRAFORM_DIR / name, workdir / name)
    init = subprocess.run(
        [binary, "init", "-input=false", "-no-color"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=terraform_env(),
        timeout=120,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    return workdir


def _var_flag(name, value) -> str:
    """One -var flag. JSON is valid HCL for numbers, bools, lists and objects."""
    return f"-var={name}={value if isinstance(value, str) else json.dumps(value)}"


@pytest.mark.parametrize("case_id, overrides, failing", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
def test_terraform_itself_agrees_on_validation(variables_only_workdir, case_id, overrides, failing):
    flags = [_var_flag(name, value) for name, value in {**PROJECT, **overrides}.items()]
    result = subprocess.run(
        [terraform_binary(), "plan", "-input=false", "-no-color", "-lock=false", *flags],
        cwd=variables_only_workdir,
        capture_output=True,
        text=True,
        env=terraform_env(),
        timeout=120,
    )
    output = result.stdout + result.stderr
    if failing:
        assert result.returncode != 0, output
        rejected = set(re.findall(r"<value for var\.(\w+)>", output))
        # A value given with -var can be reported at the variable's own block.
        rejected |= set(re.findall(r'variable "(\w+)"', output))
        # Terraform skips the rules that refer to a variable it has already
        # rejected (gpu_count after machine_type), so it may name fewer.
        assert rejected and rejected <= failing, output
    else:
        assert result.returncode == 0, output


def test_cpu_pool_and_time_shared_gpu_pool(tf):
    cpu = _resource(tf, "google_container_node_pool", "cpu")
    assert cpu["name"] == "cpu-pool"
    assert cpu["autoscaling"] == [
        {"min_node_count": "${var.cpu_min_node_count}", "max_node_count": "${var.cpu_max_node_count}"}
    ]
    (node,) = cpu["node_config"]
    assert node["machine_type"] == "${var.cpu_machine_type}" and "guest_accelerator" not in node
    assert node["workload_metadata_config"] == [{"mode": "GKE_METADATA"}]
    shared = _resource(tf, "google_container_node_pool", "gpu_shared")
    assert shared["name"] == "gpu-shared-pool"
    assert shared["autoscaling"] == [{"min_node_count": 0, "max_node_count": "${var.shared_gpu_max_node_count}"}]
    (node,) = shared["node_config"]
    (accelerator,) = node["guest_accelerator"]
    assert accelerator["gpu_sharing_config"] == [
        {
            "gpu_sharing_strategy": "${var.gpu_sharing_strategy}",
            "max_shared_clients_per_gpu": "${var.max_shared_clients_per_gpu}",
        }
    ]
    assert accelerator["gpu_driver_installation_config"] == [{"gpu_driver_version": "${var.gpu_driver_version}"}]
