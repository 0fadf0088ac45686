"""Device figures: peak FLOP/s, memory, links and their latencies, for the GPUs and TPUs the course models.

Every figure carries its source beside it. :func:`find_peak` maps a JAX
``device.device_kind`` to its :class:`DevicePeak`; :mod:`dpcourse.costs`
builds the cost model (MFU, all-reduce times) on these figures.

Which peak MFU divides by: JAX's default float32 matmul precision
(``jax.default_matmul_precision`` "default") lets XLA use TF32 tensor cores
on NVIDIA GPUs from Ampere on, so float32 MFU there is quoted against the
TF32 peak; on a TPU the same default is one bfloat16 pass on the MXU
(``"highest"`` takes six), so float32 MFU there is quoted against the bf16
peak. :attr:`DevicePeak.float32_matmul` says which, per device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TFLOP = 1e12
GB = 1e9
GIB = 2**30

# Latencies of one NCCL ring all-reduce, from NCCL's own tuning model
# (NVIDIA/nccl, src/graph/tuning.cc, the ``baseLat`` and ``hwLat`` tables,
# Ring algorithm, Simple protocol): a fixed 8.4 us per collective plus, per
# ring step, 3.4 us over NVLink and 5.7 us over PCIe. The LL and LL128
# protocols NCCL uses for smaller buffers have smaller step latencies and less
# bandwidth. A measured figure (lesson 07's link fit) beats these.
NCCL_RING_BASE_S = 8.4e-6
NCCL_RING_STEP_NVLINK_S = 3.4e-6
NCCL_RING_STEP_PCIE_S = 5.7e-6

# One ICI hop: "typically around 1us" (Austin et al., "How to Scale Your
# Model", Google DeepMind 2025, the sharding chapter's note on ICI latency).
ICI_HOP_LATENCY_S = 1e-6

_PRECISIONS = ("fp32", "tf32", "bf16")


@dataclass(frozen=True)
class Ici:
    """A TPU chip's inter-chip interconnect (ICI): links and the torus a slice forms.

    Attributes:
        links_per_chip: ICI ports of one chip (4 on a 2D torus, 6 on a 3D one).
        torus_dims: 2 or 3.
        full_axis: the axis length that closes a ring with a wraparound link:
            16 on v5e and v6e (an axis of the full 16 x 16 pod), 4 on v5p,
            where the optical switches close every axis of a slice made of
            whole 4 x 4 x 4 cubes.
    """

    links_per_chip: int
    torus_dims: int
    full_axis: int

    def wraparound(self, shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Which axes of a slice of ``shape`` chips have a wraparound link (a ring, not a line).

        v5e and v6e: an axis of 16 chips, so a v5e-8 (2 x 4) has none and an
        8 x 16 has one, on its long axis (Austin et al., the TPU chapter).
        v5p: every axis, when every axis is a multiple of 4 (whole cubes:
        Google's v5p page gives slices of one 4x4x4 cube and larger a full 3D
        torus), else none (a 2 x 4 x 4 has none: Austin et al., the wraparounds
        come from the optical switches of whole cubes).

        Raises:
            ValueError: a shape with more axes than the torus or an axis < 1.
        """
        if not 1 <= len(shape) <= self.torus_dims or any(s < 1 for s in shape):
            raise ValueError(
                f"A slice shape has 1 to {self.torus_dims} axes of at least 1 chip, got {shape}: "
                "give it as the TPU's topology, e.g. (2, 4) for a v5e-8."
            )
        if self.torus_dims == 3:
            cubes = len(shape) == 3 and all(s % self.full_axis == 0 for s in shape)
            return tuple(cubes for _ in shape)
        return tuple(s == self.full_axis for s in shape)


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak throughput of one device, FLOP/s, its link to its peers and their latencies.

    Attributes:
        name: product name.
        fp32_flops_per_s, tf32_flops_per_s, bf16_flops_per_s: dense peaks;
            None where the maker publishes none (a TPU's float32 and TF32).
        link: interconnect used for the all-reduce between devices ("ICI" on a TPU).
        link_bytes_per_s: one-direction bandwidth of one link, bytes/s.
        source: where the figures come from.
        float32_matmul: the precision a float32 matmul runs at under JAX's
            default precision: "tf32" on the GPUs listed, "bf16" on TPUs.
        hbm_bytes, hbm_bytes_per_s: device memory and its bandwidth (None: not listed).
        hop_latency_s: fixed time per ring step or ICI hop, seconds.
        collective_latency_s: fixed time per collective call, seconds.
        ici: a TPU's interconnect (None on a GPU).
    """

    name: str
    fp32_flops_per_s: float | None
    tf32_flops_per_s: float | None
    bf16_flops_per_s: float
    link: str
    link_bytes_per_s: float
    source: str
    float32_matmul: str = "tf32"
    hbm_bytes: float | None = None
    hbm_bytes_per_s: float | None = None
    hop_latency_s: float = 0.0
    collective_latency_s: float = 0.0
    ici: Ici | None = None

    def peak(self, precision: str | None = None) -> float:
        """Peak FLOP/s for ``precision`` in {"fp32", "tf32", "bf16"}; None: :attr:`float32_matmul`'s.

        Raises:
            ValueError: another precision name, or one this device has no published peak for.
        """
        precision = self.float32_matmul if precision is None else precision
        if precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}.")
        value = {"fp32": self.fp32_flops_per_s, "tf32": self.tf32_flops_per_s, "bf16": self.bf16_flops_per_s}[precision]
        if value is None:
            raise ValueError(
                f"{self.name} has no published {precision} peak; JAX's default float32 matmul runs at "
                f"{self.float32_matmul} here: use peak() or peak({self.float32_matmul!r})."
            )
        return value

    @property
    def is_tpu(self) -> bool:
        return self.ici is not None

    def mfu_note(self) -> str:
        """One sentence: which peak float32 MFU on this device divides by, and why."""
        if self.float32_matmul == "bf16":
            return (
                f"A float32 matmul at JAX's default precision is one bf16 pass on {self.name}'s MXU "
                "(precision 'highest' takes six), so MFU divides by the bf16 peak."
            )
        return (
            f"A float32 matmul at JAX's default precision runs on {self.name}'s TF32 tensor cores, "
            "so MFU divides by the TF32 peak (precision 'highest': the FP32 peak)."
        )


# TPU figures: Google Cloud's TPU pages, per chip. "Bidirectional ICI
# bandwidth per chip" counts every port in both directions, so one link
# each way is that figure / ports / 2. Austin et al.'s table ("How to Scale
# Your Model", the TPU chapter: jax-ml/scaling-book, tpus.md, its main branch
# of February 2025) gives other figures, 10% lower: 4.5e10 bytes/s (v5e) and
# 9e10 (v5p, v6e) per link one way, 9e10 and 1.8e11 both ways; the model
# below uses Google's.
_V5E_URL = "https://cloud.google.com/tpu/docs/v5e"
_V5P_URL = "https://cloud.google.com/tpu/docs/v5p"
_V6E_URL = "https://cloud.google.com/tpu/docs/v6e"

TPU_V5E = DevicePeak(
    "Google TPU v5e",
    None,
    None,
    197 * TFLOP,
    "ICI",
    50 * GB,
    f"{_V5E_URL}: bf16 197 TFLOPs per chip; HBM2 16 GB at 819 GBps; bidirectional ICI 400 GBps per chip "
    "over 4 ICI ports (50 GB/s each way per link); 2D torus, 256-chip pod",
    float32_matmul="bf16",
    hbm_bytes=16 * GB,
    hbm_bytes_per_s=819 * GB,
    hop_latency_s=ICI_HOP_LATENCY_S,
    ici=Ici(links_per_chip=4, torus_dims=2, full_axis=16),
)
TPU_V5P = DevicePeak(
    "Google TPU v5p",
    None,
    None,
    459 * TFLOP,
    "ICI",
    100 * GB,
    f"{_V5P_URL}: bf16 459 TFLOPs per chip; HBM 95 GiB at 2765 GBps; bidirectional ICI 1200 GBps per chip, "
    "3D torus (6 links, one per neighbour: 100 GB/s each way per link); full torus from one 4x4x4 cube",
    float32_matmul="bf16",
    hbm_bytes=95 * GIB,
    hbm_bytes_per_s=2765 * GB,
    hop_latency_s=ICI_HOP_LATENCY_S,
    ici=Ici(links_per_chip=6, torus_dims=3, full_axis=4),
)
TPU_V6E = DevicePeak(
    "Google TPU v6e (Trillium)",
    None,
    None,
    918 * TFLOP,
    "ICI",
    100 * GB,
    f"{_V6E_URL}: bf16 918 TFLOPs per chip; HBM 32 GB at 1638 GBps; bidirectional ICI 800 GBps per chip "
    "over 4 ICI ports (100 GB/s each way per link); 2D torus, 256-chip pod",
    float32_matmul="bf16",
    hbm_bytes=32 * GB,
    hbm_bytes_per_s=1638 * GB,
    hop_latency_s=ICI_HOP_LATENCY_S,
    ici=Ici(links_per_chip=4, torus_dims=2, full_axis=16),
)

# GPU datasheet values are quoted "with sparsity" for TF32/BF16; the dense
# figures are half of those. PCIe Gen4 x16: about 32 GB/s each way (PCI-SIG
# 16 GT/s x 16 lanes, 128b/130b encoding); Gen5 twice that. NVLink4
# (H100/H200 SXM): 900 GB/s in total, 450 GB/s each way; NVLink3 (A100 SXM):
# 600 GB/s total, 300 each way. A PCIe card's optional NVLink bridge joins
# pairs of cards only, so the PCIe entries quote the PCIe link.
#
# Each entry: (key, tokens that must all appear in the device kind, peak).
# The kind is split into tokens at every non-alphanumeric character, so
# "A100" matches "NVIDIA A100-SXM4-80GB" but not "RTX A1000", and "L4" does
# not match "L40S". The first matching entry wins: PCIe entries come first,
# and a TPU's "lite" kind (JAX's name for v5e and v6e chips: "TPU v5 lite",
# "TPU v6 lite") before the plain "TPU v5" (a v5p chip).
PEAKS: tuple[tuple[str, tuple[str, ...], DevicePeak], ...] = (
    (
        "l4",
        ("L4",),
        DevicePeak(
            "NVIDIA L4",
            30.3 * TFLOP,
            60 * TFLOP,
            121 * TFLOP,
            "PCIe Gen4 x16",
            32 * GB,
            "NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120*, BF16 242* TFLOPS (*with sparsity); "
            "no NVLink: PCIe Gen4 x16, 32 GB/s each way",
            hop_latency_s=NCCL_RING_STEP_PCIE_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    (
        "a100-pcie",
        ("A100", "PCIE"),
        DevicePeak(
            "NVIDIA A100 PCIe",
            19.5 * TFLOP,
            156 * TFLOP,
            312 * TFLOP,
            "PCIe Gen4 x16",
            32 * GB,
            "NVIDIA A100 Tensor Core GPU datasheet, PCIe columns (40GB, 80GB): FP32 19.5, TF32 156 (312*), "
            "BF16 312 (624*) TFLOPS; link PCIe Gen4 x16, 32 GB/s each way (PCI-SIG 16 GT/s x 16, 128b/130b)",
            hop_latency_s=NCCL_RING_STEP_PCIE_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    (
        "a100",
        ("A100",),
        DevicePeak(
            "NVIDIA A100 SXM",
            19.5 * TFLOP,
            156 * TFLOP,
            312 * TFLOP,
            "NVLink3 (SXM)",
            300 * GB,
            "NVIDIA A100 Tensor Core GPU datasheet, SXM columns: FP32 19.5, TF32 156 (312*), BF16 312 (624*) "
            "TFLOPS; NVLink3 600 GB/s in total, 300 GB/s each way",
            hop_latency_s=NCCL_RING_STEP_NVLINK_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    (
        "h100-pcie",
        ("H100", "PCIe"),
        DevicePeak(
            "NVIDIA H100 PCIe",
            51 * TFLOP,
            378 * TFLOP,
            756 * TFLOP,
            "PCIe Gen5 x16",
            64 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: FP32 51, TF32 756*, BF16 1,513* TFLOPS; "
            "link PCIe Gen5 x16, 64 GB/s each way (PCI-SIG 32 GT/s x 16)",
            hop_latency_s=NCCL_RING_STEP_PCIE_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    (
        "h100",
        ("H100",),
        DevicePeak(
            "NVIDIA H100 SXM",
            67 * TFLOP,
            495 * TFLOP,
            989 * TFLOP,
            "NVLink4",
            450 * GB,
            "NVIDIA H100 Tensor Core GPU datasheet, SXM column: FP32 67, TF32 989*, BF16 1,979* TFLOPS; "
            "NVLink4 900 GB/s in total, 450 GB/s each way",
            hop_latency_s=NCCL_RING_STEP_NVLINK_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    (
        "h200",
        ("H200",),
        DevicePeak(
            "NVIDIA H200 SXM",
            67 * TFLOP,
            495 * TFLOP,
            989 * TFLOP,
            "NVLink4",
            450 * GB,
            "NVIDIA H200 Tensor Core GPU datasheet, SXM column: FP32 67, TF32 989*, BF16 1,979* TFLOPS; "
            "NVLink4 900 GB/s in total, 450 GB/s each way",
            hop_latency_s=NCCL_RING_STEP_NVLINK_S,
            collective_latency_s=NCCL_RING_BASE_S,
        ),
    ),
    ("tpu-v5e", ("TPU", "V5", "LITE"), TPU_V5E),
    ("tpu-v5e-name", ("TPU", "V5E"), TPU_V5E),
    ("tpu-v6e", ("TPU", "V6", "LITE"), TPU_V6E),
    ("tpu-v6e-name", ("TPU", "V6E"), TPU_V6E),
    ("tpu-v5p-name", ("TPU", "V5P"), TPU_V5P),
    ("tpu-v5p", ("TPU", "V5"), TPU_V5P),
)


def find_peak(device_kind: str) -> DevicePeak | None:
    """The :class:`DevicePeak` for a JAX ``device.device_kind``, or None.

    Matching is by whole tokens of the kind string (``"NVIDIA L4"``,
    ``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA A100-PCIE-40GB"``, ``"TPU v5 lite"``,
    ``"TPU v5"``, ``"TPU v6 lite"``, ...), case-insensitive: a PCIe part gets
    its PCIe link, an SXM part its NVLink, a TPU its ICI. NVL variants,
    unlisted GPUs (L40S, GH200, RTX cards), other TPUs (v4, TPU7x) and every
    CPU return None: no MFU or link time is computed for them rather than an
    invented peak.
    """
    tokens = set(re.split(r"[^0-9A-Z]+", device_kind.upper()))
    if "NVL" in tokens:
        return None
    for _, needles, peak in PEAKS:
        if all(n.upper() in tokens for n in needles):
            return peak
    return None
