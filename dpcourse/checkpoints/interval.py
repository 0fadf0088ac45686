"""How often to checkpoint: the optimal checkpoint interval (Young, Daly), the time lost per failure and the goodput.

Taught in notebook 13 (what a failure costs). A run that saves every ``tau``
seconds of training, takes ``delta`` seconds per save and ``R`` seconds to
restart and restore, on machines that fail on average every ``M`` seconds
(the mean time between failures, MTBF; failures are taken as a Poisson
process, as both papers below do), pays twice: the saves themselves, and the
work redone after each failure. Saving more often cuts the second and raises
the first; the optimal checkpoint interval balances them.

- Young (1974), "A first order approximation to the optimum checkpoint
  interval", Communications of the ACM 17(9), 530-531:
  ``tau = sqrt(2 delta M)``.
- Daly (2006), "A higher order estimate of the optimum checkpoint interval
  for restart dumps", Future Generation Computer Systems 22(3), 303-312,
  equation 37: ``tau = sqrt(2 delta M) (1 + sqrt(x) / 3 + x / 9) - delta``
  with ``x = delta / (2 M)``, for ``delta < 2 M``; ``tau = M`` beyond.

The course uses Daly's: it is Young's plus the next terms of the same
expansion, so the two agree where a save is short against the MTBF (Daly's
is shorter by about ``(2/3) sqrt(delta / (2 M))`` of Young's: 0.09% for the
GKE setting below with a 24 h MTBF, 222.5 s against 222.3 s, and 2.5% for
Llama 3's, 854 s against 833 s), and only Daly's stays close to the true
optimum as the save time approaches the MTBF (his figures 3 to 5 compare
both with simulations). The cost of an interval is Daly's complete
model of the expected wall time of each segment of ``tau`` seconds of work
(every failure, during work, save or restart, sends the run back to the
last save): ``M exp(R / M) (exp((tau + delta) / M) - 1)``; the goodput, the
fraction of wall time that ends up as kept training, is ``tau`` over it.

All times are in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Compute Engine: 30 s between the ACPI G2 Soft Off that starts a Spot VM's
# preemption and the G3 Mechanical Off that ends it (the Compute Engine API's
# description of Scheduling.skipGuestOsShutdown: "120 seconds ... for Standard
# VMs and 30 seconds for Spot VMs"; https://cloud.google.com/compute/docs/instances/spot).
SPOT_NOTICE_S = 30.0
# GKE: graceful node shutdown splits those 30 s, the first 15 s to stop the
# node's ordinary Pods and the last 15 s to critical system Pods; a Standard
# node pool on GKE 1.35.0-gke.1171000 or later can raise the total to 120 s
# (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms, "Termination
# and graceful shutdown of Spot VMs"). Older pages gave Pods 25 s and system Pods 5 s.
GKE_SPOT_POD_SHUTDOWN_S = 15.0
# Kubernetes: a Pod's terminationGracePeriodSeconds when none is given
# (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination).
KUBERNETES_DEFAULT_GRACE_S = 30.0

# Lesson 11's synchronous save of the course model's training state (about 3 MB),
# measured on the 2-core build machine's local disk: baselines/cpu-jax0.10.2-11_checkpoint.json,
# record sync_save_s. Not measured on GKE's Filestore share.
LESSON11_SAVE_S = 0.28642314299941063
# Each pod of the GKE Jobs installs JAX and the course at every start: "about 5
# minutes" (docs/multihost.md), the part of a restart the course can name; the
# wait for GKE to recreate a preempted Spot VM comes on top and is not measured.
GKE_INSTALL_S = 300.0

# Llama 3 405B pre-training (Grattafiori et al. 2024, "The Llama 3 Herd of Models",
# arXiv:2407.21783, section 3.3): "During a 54-day snapshot period of pre-training,
# we experienced a total of 466 job interruptions. Of these, 47 were planned ...
# The remaining 419 were unexpected interruptions", on up to 16K H100 GPUs (Table 4:
# 16,384). Checkpoints hold "1 MB to 4 GB per GPU" on storage with "a sustainable
# throughput of 2 TB/s". The paper gives no save or restart time.
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_WINDOW_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_MAX_STATE_BYTES_PER_GPU = 4e9
LLAMA3_STORAGE_BYTES_PER_S = 2e12

DAY_S = 86_400.0


def _check(**times: float) -> None:
    for name, value in times.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} is a time in seconds >= 0, got {value!r}.")


def _check_mtbf(mtbf_s: float) -> None:
    if not (isinstance(mtbf_s, (int, float)) and math.isfinite(mtbf_s) and mtbf_s > 0):
        raise ValueError(f"The mean time between failures is in seconds and > 0, got {mtbf_s!r}.")


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval ``sqrt(2 x save x MTBF)``, seconds of training between saves.

    Young (1974), CACM 17(9). First order in ``save_s / mtbf_s``: good while
    a save is short against the MTBF (see :func:`daly_interval_s`).

    Args:
        save_s: the time one save holds training up, seconds (>= 0).
        mtbf_s: the mean time between failures of the whole job, seconds (> 0).

    Raises:
        ValueError: a negative save time or an MTBF that is not > 0.
    """
    _check(save_s=save_s)
    _check_mtbf(mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly's optimal checkpoint interval, seconds of training between saves: the one the course uses.

    Daly (2006), FGCS 22(3), equation 37: with ``x = save / (2 MTBF)``,
    ``sqrt(2 save MTBF) (1 + sqrt(x) / 3 + x / 9) - save`` while the save is
    shorter than twice the MTBF, and the MTBF itself beyond. His own example
    (figure 3): a 5 min save and a 24 h MTBF give 117 min; Young's gives 120.

    Args:
        save_s: the time one save holds training up, seconds (>= 0).
        mtbf_s: the mean time between failures of the whole job, seconds (> 0).

    Raises:
        ValueError: a negative save time or an MTBF that is not > 0.
    """
    _check(save_s=save_s)
    _check_mtbf(mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return float(mtbf_s)
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def optimal_interval_s(save_s: float, mtbf_s: float) -> float:
    """The course's optimal checkpoint interval: Daly's (:func:`daly_interval_s`), seconds."""
    return daly_interval_s(save_s, mtbf_s)


def time_lost_per_failure_s(interval_s: float, save_s: float, restart_s: float) -> float:
    """Expected wall time one failure costs: half a checkpoint period redone, plus the restart and restore.

    A failure lands, on average, halfway through a period of ``interval_s``
    of training and ``save_s`` of saving (failures are as likely at any
    moment), so half of it is redone; ``restart_s`` (new processes, the
    restore of the latest checkpoint) comes on top:
    ``(interval + save) / 2 + restart``. First order: it leaves out failures
    during the restart itself, which :func:`goodput` counts.

    Args:
        interval_s: seconds of training between the starts of two saves (>= 0).
        save_s: the time one save holds training up, seconds (>= 0).
        restart_s: from the failure to training again from the checkpoint, seconds (>= 0).

    Raises:
        ValueError: a time that is negative or not a number.
    """
    _check(interval_s=interval_s, save_s=save_s, restart_s=restart_s)
    return (interval_s + save_s) / 2.0 + restart_s


def goodput(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time that ends up as kept training, in (0, 1]: Daly's complete model.

    Each segment of ``interval_s`` of training and ``save_s`` of saving is
    tried until it completes; each failure (at rate ``1 / mtbf_s``, during
    work, save or restart alike) costs a restart of ``restart_s`` and sends
    the segment back to its start. Its expected wall time is
    ``M exp(R / M) (exp((interval + save) / M) - 1)`` (Daly 2006, FGCS 22(3),
    section 4), and the goodput is ``interval`` over it. For short periods it
    is close to ``1 - save / (interval + save) - time lost per failure / M``.

    Args:
        interval_s: seconds of training between saves (> 0).
        save_s: the time one save holds training up, seconds (>= 0).
        restart_s: from a failure to training again from the checkpoint, seconds (>= 0).
        mtbf_s: the mean time between failures of the whole job, seconds (> 0).

    Raises:
        ValueError: an interval that is not > 0, a negative time, or an MTBF that is not > 0.
    """
    _check(interval_s=interval_s, save_s=save_s, restart_s=restart_s)
    _check_mtbf(mtbf_s)
    if interval_s <= 0:
        raise ValueError(f"The checkpoint interval must be > 0 seconds of training, got {interval_s!r}.")
    exponent = (interval_s + save_s) / mtbf_s
    segment_s = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(exponent)
    return interval_s / segment_s


def mtbf_from_count_s(failures: int, window_s: float) -> float:
    """The mean time between failures of a job that failed ``failures`` times in ``window_s`` seconds.

    Llama 3 405B: 419 unexpected interruptions in 54 days, one every 3.09 h
    (11,135.08 s).

    Raises:
        ValueError: a count that is not a whole number >= 1, or a window that is not > 0.
    """
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
        raise ValueError(f"Need a whole number of failures >= 1, got {failures!r}.")
    _check_mtbf(window_s)
    return window_s / failures


def interval_steps(interval_s: float, step_s: float) -> int:
    """The checkpoint interval in whole training steps (a save every N steps), at least 1.

    Raises:
        ValueError: a negative interval, or a step time that is not > 0.
    """
    _check(interval_s=interval_s)
    if not (isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"The step time is in seconds and > 0, got {step_s!r}.")
    return max(1, round(interval_s / step_s))


@dataclass(frozen=True)
class Setting:
    """The figures a checkpoint interval is chosen from, each with where it comes from.

    Attributes:
        name: what the tables call it.
        save_s: the time one save holds training up, seconds.
        restart_s: from a failure to training again from the checkpoint, seconds.
        mtbf_s: the mean time between failures of the whole job, seconds.
        sources: one line per figure: measured where, published where, or assumed.
    """

    name: str
    save_s: float
    restart_s: float
    mtbf_s: float
    sources: tuple[str, ...]

    def optimal_interval_s(self) -> float:
        """Daly's optimal checkpoint interval for these figures, seconds (:func:`daly_interval_s`)."""
        return daly_interval_s(self.save_s, self.mtbf_s)

    def goodput(self, interval_s: float | None = None) -> float:
        """The goodput at ``interval_s`` (the optimal interval when None): :func:`goodput`."""
        tau = self.optimal_interval_s() if interval_s is None else interval_s
        return goodput(tau, self.save_s, self.restart_s, self.mtbf_s)


def gke_spot_l4(mtbf_s: float, restart_s: float = GKE_INSTALL_S, save_s: float = LESSON11_SAVE_S) -> Setting:
    """The course's GKE Job on Spot VMs with 2 L4 GPUs a node: the MTBF is the caller's assumption.

    Google guarantees no preemption rate for Spot VMs ("Compute Engine might
    reclaim the resources by preempting Spot VMs at any time", no SLA) and
    publishes none as a constant: its advice.capacity API gives, for one
    machine type and zone at the time, a best-effort estimated uptime
    (https://cloud.google.com/compute/docs/instances/view-vm-availability).
    So ``mtbf_s`` is an assumption the caller states; read that API for a
    real run. The defaults: the save
    measured in lesson 11 (:data:`LESSON11_SAVE_S`, the build machine's disk,
    not Filestore) and the install every restarted pod repeats
    (:data:`GKE_INSTALL_S`, a lower bound on the restart: the wait for a new
    Spot VM is not in it).

    Raises:
        ValueError: an MTBF that is not > 0, or a negative time.
    """
    _check(save_s=save_s, restart_s=restart_s)
    _check_mtbf(mtbf_s)
    return Setting(
        name="GKE, Spot VMs, 2 x L4 a node",
        save_s=save_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
        sources=(
            f"save {save_s:.3g} s: "
            + (
                "lesson 11's synchronous save on the build machine (baselines/cpu-jax0.10.2-11_checkpoint.json)"
                if save_s == LESSON11_SAVE_S
                else "given"
            ),
            f"restart {restart_s:.0f} s: "
            + (
                "the reinstall each pod repeats (docs/multihost.md), without the wait for a new Spot VM"
                if restart_s == GKE_INSTALL_S
                else "given"
            ),
            f"MTBF {mtbf_s / 3600:.3g} h: an assumption; Google guarantees no preemption rate for Spot VMs"
            " (its advice.capacity API estimates an uptime per machine type and zone, not a preemption rate)",
        ),
    )


def llama3_405b(restart_s: float = 0.0) -> Setting:
    """Llama 3 405B's pre-training on 16,384 H100 GPUs: 419 unexpected interruptions in 54 days.

    MTBF: 54 days / 419 = 3.09 h (Grattafiori et al. 2024, section 3.3.4).
    The paper gives no save time: the save here is the largest state it names
    (4 GB per GPU, x 16,384 GPUs, 65.5 TB) written at its storage's
    sustained 2 TB/s, 32.8 s; nor a restart time: ``restart_s`` defaults to
    0. The two assumptions pull the goodput in opposite directions (no
    restart raises it; the largest per-GPU state on every GPU, about ten
    times the 16 bytes a parameter of a 405B model's training state takes,
    lowers it), so its 92.5% at Daly's interval bounds nothing: an estimate
    beside the paper's "higher than 90% effective training time".

    Raises:
        ValueError: a negative restart time.
    """
    _check(restart_s=restart_s)
    save_s = LLAMA3_GPUS * LLAMA3_MAX_STATE_BYTES_PER_GPU / LLAMA3_STORAGE_BYTES_PER_S
    mtbf_s = mtbf_from_count_s(LLAMA3_UNEXPECTED_INTERRUPTIONS, LLAMA3_WINDOW_DAYS * DAY_S)
    return Setting(
        name="Llama 3 405B, 16,384 x H100",
        save_s=save_s,
        restart_s=restart_s,
        mtbf_s=mtbf_s,
        sources=(
            f"save {save_s:.1f} s: 16,384 GPUs x 4 GB (the largest state per GPU the paper names)"
            " at the storage's sustained 2 TB/s; the paper gives no save time",
            f"restart {restart_s:.0f} s: "
            + (
                "the paper gives none (this raises the goodput; the save above lowers it)"
                if restart_s == 0
                else "given"
            ),
            f"MTBF {mtbf_s / 3600:.2f} h: 419 unexpected interruptions in a 54-day snapshot"
            " (The Llama 3 Herd of Models, arXiv:2407.21783, section 3.3.4)",
        ),
    )


def table_rows(settings: Sequence[Setting]) -> list[dict[str, float | str]]:
    """One row per setting for :func:`dpcourse.show.table`: its figures, both optimal intervals, what a failure costs.

    Columns: the setting; save, restart and MTBF; Young's and Daly's
    intervals; at Daly's, the time lost per failure
    (:func:`time_lost_per_failure_s`) and the goodput (:func:`goodput`).
    Times in seconds, the MTBF in hours.

    Raises:
        ValueError: no settings.
    """
    if not settings:
        raise ValueError("Need at least one Setting (gke_spot_l4(mtbf_s), llama3_405b(), or your own).")
    rows = []
    for s in settings:
        tau = s.optimal_interval_s()
        rows.append(
            {
                "setting": s.name,
                "save (s)": s.save_s,
                "restart (s)": s.restart_s,
                "MTBF (h)": s.mtbf_s / 3600.0,
                "Young's interval (s)": young_interval_s(s.save_s, s.mtbf_s),
                "Daly's interval (s)": tau,
                "lost per failure (s)": time_lost_per_failure_s(tau, s.save_s, s.restart_s),
                "goodput": s.goodput(tau),
            }
        )
    return rows
