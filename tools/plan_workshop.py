"""How many nodes and GPUs a room of learners needs on GKE, and its hourly cost from prices the instructor gives.

    python tools/plan_workshop.py --learners 24 [--mix cpu=0.5,shared-l4=0.5]
        [--price e2-standard-8=USD_PER_HOUR --price g2-standard-24=USD_PER_HOUR --price-date YYYY-MM-DD]
    make plan-workshop LEARNERS=24 [MIX=...] [PRICES="e2-standard-8=... g2-standard-24=..."] [PRICE_DATE=...]

Per-learner requests come from deploy/hub/config.yaml (the profiles'
guarantees, in GiB as KubeSpawner reads them); machine shapes from Compute
Engine's machine-type tables (E2 standard: 4 GB per vCPU; G2: the table in
terraform/locals.tf with 4 GB per vCPU); a node's allocatable CPU and memory
from GKE's documented reservations ("Standard cluster architecture > Node
allocatable resources", cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes),
less SYSTEM_PODS for the daemon sets (an estimate, stated in the output). The
hub itself (hub, proxy, user scheduler) takes HUB_PODS on the CPU pool.

Prices are inputs: this tool ships none, because list prices change and
differ by region. Take them from cloud.google.com/compute/vm-instance-pricing
(GPU included for G2) or the pricing calculator, with their date. Without
them the cost column says "price not given".

Time-sharing's effect on each learner's speed is NOT MEASURED here: with N
learners computing on one L4 at the same moment each gets about 1/N of its
time at best (GKE time-slices, no memory isolation); idle learners cost the
others nothing. How the L4s are shared, and by how many, is terraform's
(``gpu_sharing_strategy``, ``max_shared_clients_per_gpu``), read here from
the node labels the hub's shared-L4 profile selects.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deploy" / "hub" / "config.yaml"
GIB = 2**30
# (vCPUs, memory in GB of 2**30 bytes as Compute Engine counts it, L4 GPUs)
MACHINES = {
    "e2-standard-4": (4, 16, 0),
    "e2-standard-8": (8, 32, 0),
    "e2-standard-16": (16, 64, 0),
    "e2-standard-32": (32, 128, 0),
    "g2-standard-24": (24, 96, 2),
    "g2-standard-48": (48, 192, 4),
    "g2-standard-96": (96, 384, 8),
}
POOLS = {"cpu": "e2-standard-8", "shared-l4": "g2-standard-24", "two-l4": "g2-standard-24"}
SYSTEM_PODS = (0.4, 1.0)  # vCPU, GiB per node for GKE's daemon sets and the pre-puller: an estimate
HUB_PODS = (1.0, 2.0)  # vCPU, GiB for hub, proxy and user scheduler on the CPU pool: an estimate
FORCED = "two-l4 (gpu_node_count >= 1)"  # the GPU node terraform makes whatever the mix
SHARING_LABELS = ("cloud.google.com/gke-gpu-sharing-strategy", "cloud.google.com/gke-max-shared-clients-per-gpu")


def gpu_sharing(config_path: Path = CONFIG) -> tuple[str, int]:
    """How the shared-L4 profile's GPUs are shared (``"time-sharing"`` or ``"mps"``) and by how many learners.

    Read from the node labels the profile selects in deploy/hub/config.yaml,
    which tests/hub/test_gke_hub_config.py keeps equal to terraform's
    ``gpu_sharing_strategy`` and ``max_shared_clients_per_gpu`` (terraform/variables.tf, where they are set).
    """
    single = yaml.safe_load(config_path.read_text())["singleuser"]
    shared = next(e for e in single["profileList"] if e["slug"] == "shared-l4")["kubespawner_override"]["node_selector"]
    return shared[SHARING_LABELS[0]], int(shared[SHARING_LABELS[1]])


STRATEGY, CLIENTS_PER_GPU = gpu_sharing()


BASELINES = ROOT / "baselines"


@dataclass(frozen=True)
class Measured:
    """The largest peak of one kind over a run's lessons, and where it comes from."""

    gib: float
    notebook: str
    source: str  # the baseline file, relative to the repository


def measured_peaks(kind: str, profile: str = "cpu", folder: Path = BASELINES) -> dict[str, Measured]:
    """Each lesson's ``peak_rss_bytes`` or ``peak_gpu_bytes`` (``kind``) from the newest baseline run that measured it.

    Reads every ``baselines/*.json`` that is a course run (``results.json``:
    ``profile`` and a list of ``notebooks``) of ``profile``; per lesson, the
    newest (``created``) run in which it passed with the figure wins, so a
    run of one lesson adds that lesson without hiding the others.
    """
    newest: dict[str, tuple[str, Measured]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            run = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(run, dict) or run.get("profile") != profile or not isinstance(run.get("notebooks"), list):
            continue
        created = run.get("created", "")
        for entry in run["notebooks"]:
            name = entry.get("notebook")
            if entry.get(kind) and entry.get("status") == "passed" and created >= newest.get(name, ("",))[0]:
                newest[name] = (created, Measured(entry[kind] / GIB, name, _shown(path)))
    return {name: newest[name][1] for name in sorted(newest)}


def measured_peak(kind: str, profile: str = "cpu", folder: Path = BASELINES) -> Measured | None:
    """The largest of :func:`measured_peaks`; None when no baseline has the figure."""
    return max(measured_peaks(kind, profile, folder).values(), key=lambda m: m.gib, default=None)


def course_lessons(notebooks: Path = ROOT / "notebooks") -> list[str]:
    """The course's lessons (``01_setup``, ...), from its notebooks folder."""
    return sorted(p.stem for p in notebooks.glob("[0-9][0-9]_*.ipynb"))


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def memory_notes(found: dict[str, Profile], folder: Path = BASELINES, lessons: list[str] | None = None) -> list[str]:
    """What the memory requests rest on: the measured peaks where a baseline has them, else 'an estimate'.

    ``lessons``: the course's (:func:`course_lessons` by default); any without a measured peak is named.
    """
    lessons = course_lessons() if lessons is None else lessons
    rss = measured_peak("peak_rss_bytes", "cpu", folder)
    gpu = measured_peak("peak_gpu_bytes", "full", folder)
    cpu_request = found["cpu"].memory_gib
    if rss is None:
        lines = [
            f"Memory: the cpu profile's {cpu_request:g} GiB request is an estimate: no baseline records a lesson's "
            "peak memory (python -m coursetools run --profile cpu writes it; copy its results.json to baselines/)."
        ]
    else:
        lines = [
            f"Memory: the largest lesson's peak on the cpu profile, measured: {rss.gib:.2f} GiB ({rss.notebook}, "
            f"kernel and children, {rss.source}); the cpu profile requests {cpu_request:g} GiB."
        ]
        missing = [name for name in lessons if name not in measured_peaks("peak_rss_bytes", "cpu", folder)]
        if missing:
            lines[0] += (
                f" Not measured, so possibly larger: {', '.join(missing)} (python -m coursetools run --profile cpu "
                "--notebooks NN writes it; copy its results.json to baselines/)."
            )
    if gpu is None:
        lines.append(
            "GPU memory per learner: not measured (no GPU baseline records it); 24 GB per L4 shared by "
            f"{CLIENTS_PER_GPU} is an estimate."
        )
    else:
        lines.append(
            f"GPU memory: the largest lesson's peak, measured: {gpu.gib:.2f} GiB ({gpu.notebook}, "
            f"{gpu.source}); an L4 shared by {CLIENTS_PER_GPU} gives each about {24 / CLIENTS_PER_GPU:g} GB."
        )
    return lines


def allocatable(vcpus: int, memory_gib: float) -> tuple[float, float]:
    """GKE's allocatable (vCPU, GiB) of a node: its documented CPU and memory reservations and eviction threshold."""
    cpu_reserved = 0.06 + 0.01 * min(max(vcpus - 1, 0), 1) + 0.005 * min(max(vcpus - 2, 0), 2)
    cpu_reserved += 0.0025 * max(vcpus - 4, 0)
    steps = [(4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (math.inf, 0.02)]
    left, mem_reserved = memory_gib, 0.0
    for size, share in steps:
        part = min(left, size)
        mem_reserved += part * share
        left -= part
        if left <= 0:
            break
    return vcpus - cpu_reserved, memory_gib - mem_reserved - 100 / 1024


def _gib(value) -> float:
    text = str(value)
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return float(text[:-1]) * units[text[-1]] / GIB if text[-1] in units else float(text) / GIB


@dataclass(frozen=True)
class Profile:
    slug: str
    cpu: float
    memory_gib: float
    gpus: int


def profiles(config_path: Path = CONFIG) -> dict[str, Profile]:
    """Each profile's guaranteed vCPUs, memory and GPUs, from the z2jh config."""
    single = yaml.safe_load(config_path.read_text())["singleuser"]
    found = {}
    for entry in single["profileList"]:
        over = entry.get("kubespawner_override", {})
        gpus = int(over.get("extra_resource_limits", {}).get("nvidia.com/gpu", 0))
        found[entry["slug"]] = Profile(
            entry["slug"],
            float(over.get("cpu_guarantee", single["cpu"]["guarantee"])),
            _gib(over.get("mem_guarantee", single["memory"]["guarantee"])),
            gpus,
        )
    return found


@dataclass(frozen=True)
class Row:
    slug: str
    learners: int
    machine: str
    per_node: int
    nodes: int
    gpus: int


def per_node(profile: Profile, machine: str, hub_node: bool = False) -> int:
    """Learners of ``profile`` that fit on one node of ``machine``."""
    vcpus, mem, l4 = MACHINES[machine]
    cpu, gib = allocatable(vcpus, mem)
    cpu, gib = cpu - SYSTEM_PODS[0], gib - SYSTEM_PODS[1]
    if hub_node:
        cpu, gib = cpu - HUB_PODS[0], gib - HUB_PODS[1]
    fit = min(math.floor(cpu / profile.cpu), math.floor(gib / profile.memory_gib))
    if profile.gpus:
        slots = l4 * CLIENTS_PER_GPU if profile.slug == "shared-l4" else l4 // profile.gpus
        fit = min(fit, slots)
    return max(fit, 0)


def plan(learners: int, mix: dict[str, float], found: dict[str, Profile] | None = None) -> list[Row]:
    """Nodes and GPUs per profile for ``learners`` split by ``mix`` (fractions; the rest of the rounding to the first)."""
    found = profiles() if found is None else found
    unknown = set(mix) - set(found)
    if unknown:
        raise ValueError(f"unknown profile(s) {sorted(unknown)} in the mix: choose from {sorted(found)}")
    if abs(sum(mix.values()) - 1) > 1e-6:
        raise ValueError(f"the mix's shares add up to {sum(mix.values()):g}, not 1: for example cpu=0.5,shared-l4=0.5")
    counts = {slug: math.floor(learners * share) for slug, share in mix.items()}
    counts[next(iter(mix))] += learners - sum(counts.values())
    rows = []
    for slug, count in counts.items():
        machine = POOLS[slug]
        profile = found[slug]
        if slug == "cpu":
            first, rest = per_node(profile, machine, hub_node=True), per_node(profile, machine)
            nodes = 1 + max(0, math.ceil((count - first) / rest)) if count else 1
            fit = rest
        else:
            fit = per_node(profile, machine)
            nodes = math.ceil(count / fit) if count else 0
        rows.append(Row(slug, count, machine, fit, nodes, nodes * MACHINES[machine][2]))
    if "cpu" not in counts:  # the hub still needs its CPU node
        rows.append(Row("cpu", 0, POOLS["cpu"], per_node(found["cpu"], POOLS["cpu"]), 1, 0))
    # terraform's GPU pool has a fixed size of gpu_node_count >= 1 (terraform/variables.tf): its node
    # runs and costs even with no two-L4 learner.
    if not any(r.slug == "two-l4" and r.nodes for r in rows):
        rows = [r for r in rows if r.slug != "two-l4"]
        machine = POOLS["two-l4"]
        rows.append(Row(FORCED, 0, machine, per_node(found["two-l4"], machine), 1, MACHINES[machine][2]))
    return rows


def table(rows: list[Row], prices: dict[str, float], price_date: str | None) -> str:
    """The plan as a Markdown table with the hourly cost (or "price not given")."""
    lines = [
        "| profile | learners | machine | learners per node | nodes | L4 GPUs | USD per hour |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    total, complete = 0.0, True
    for row in rows:
        price = prices.get(row.machine)
        if price is None:
            cost, complete = "price not given", False
        else:
            cost = f"{row.nodes * price:.2f}"
            total += row.nodes * price
        lines.append(
            f"| {row.slug} | {row.learners} | {row.machine} | {row.per_node} | {row.nodes} | {row.gpus} | {cost} |"
        )
    nodes, gpus = sum(r.nodes for r in rows), sum(r.gpus for r in rows)
    lines.append(
        f"| total | {sum(r.learners for r in rows)} | | | {nodes} | {gpus} | "
        f"{f'{total:.2f}' if complete else 'prices missing'} |"
    )
    notes = [
        "",
        f"Per-node counts: GKE's allocatable resources less {SYSTEM_PODS[0]} vCPU and {SYSTEM_PODS[1]} GiB for "
        f"system pods (an estimate); the first CPU node also holds the hub ({HUB_PODS[0]} vCPU, {HUB_PODS[1]} GiB, "
        "an estimate). The shared-L4 profile: "
        f"{CLIENTS_PER_GPU} learners per L4 (max_shared_clients_per_gpu).",
        f"{'Time-sharing' if STRATEGY == 'time-sharing' else STRATEGY.upper()}'s effect on a learner's speed: "
        "not measured. With k learners computing on one L4 at the same moment, each gets at most about 1/k of its "
        "time; memory is shared (24 GB per L4).",
    ]
    if prices:
        notes.append(
            f"Prices: instructor's input{f', dated {price_date}' if price_date else ' (no date given)'}; "
            "on-demand list prices are at cloud.google.com/compute/vm-instance-pricing."
        )
    else:
        notes.append(
            "Prices: none given. Pass --price MACHINE=USD_PER_HOUR for each machine, from "
            "cloud.google.com/compute/vm-instance-pricing, with --price-date."
        )
    notes += memory_notes(profiles())
    if any(r.slug == FORCED for r in rows):
        notes.append(
            "The GPU pool (two-l4) has a fixed size and terraform requires gpu_node_count >= 1: its one node "
            "with 2 L4 runs and is paid for even with no two-L4 learner."
        )
    notes.append(
        "terraform.tfvars: set cpu_max_node_count and shared_gpu_max_node_count to at least the nodes above, "
        "and gpu_node_count to the two-l4 nodes (at least 1); make preflight checks the quotas."
    )
    return "\n".join(lines + notes)


def _parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        try:
            mix[name.strip()] = float(share)
        except ValueError:
            raise SystemExit(f"plan-workshop: {part!r} is not PROFILE=SHARE (for example cpu=0.5)") from None
    return mix


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, required=True)
    parser.add_argument("--mix", default="cpu=0.5,shared-l4=0.5", help="shares per profile, adding up to 1")
    parser.add_argument("--price", action="append", default=[], metavar="MACHINE=USD_PER_HOUR")
    parser.add_argument("--price-date", default=None)
    args = parser.parse_args(argv)
    if args.learners < 1:
        print("plan-workshop: --learners must be at least 1", file=sys.stderr)
        return 2
    prices = {}
    for item in args.price:
        machine, _, value = item.partition("=")
        try:
            prices[machine] = float(value)
        except ValueError:
            print(f"plan-workshop: --price {item!r} is not MACHINE=USD_PER_HOUR", file=sys.stderr)
            return 2
    try:
        rows = plan(args.learners, _parse_mix(args.mix))
    except ValueError as err:
        print(f"plan-workshop: {err}", file=sys.stderr)
        return 2
    print(f"A room of {args.learners} learners, mix {args.mix}:\n")
    print(table(rows, prices, args.price_date))
    return 0


if __name__ == "__main__":
    sys.exit(main())
