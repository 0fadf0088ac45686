"""Peak memory of a running kernel: host RSS of the process and its children, and GPU memory where nvidia-smi is.

The runner (coursetools/runner.py) watches each lesson's kernel while it
runs and writes the peaks into ``results.json`` (``peak_rss_bytes``,
``peak_gpu_bytes``), the figures that plan-workshop and the hub's memory
requests are checked against.

Host memory: the resident set size (RSS) of the kernel and every process
below it (XLA's compile workers, a lesson's own launcher), summed at each
sample, read with psutil (ipykernel's own dependency) every ``interval_s``.
A peak shorter than the interval can be missed: the figure is a lower bound.
GPU memory: ``nvidia-smi --query-compute-apps=pid,used_memory`` (MiB per
process, NVIDIA's documented query), summed over the same processes, every
``gpu_interval_s``; None where there is no nvidia-smi or it lists none.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

MIB = 1024 * 1024


def tree_rss_bytes(pid: int) -> tuple[int, list[int]]:
    """(RSS in bytes of ``pid`` and its descendants, their pids); (0, []) when the process is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, []
    total, pids = 0, []
    for process in processes:
        try:
            total += process.memory_info().rss
            pids.append(process.pid)
        except psutil.Error:  # ended between the listing and the read
            continue
    return total, pids


def gpu_bytes(pids: list[int], smi: str | None) -> int | None:
    """GPU memory in bytes that nvidia-smi reports for ``pids``; None without nvidia-smi or a listed process."""
    if smi is None or not pids:
        return None
    try:
        listing = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = {}
    for line in listing.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            used[int(parts[0])] = used.get(int(parts[0]), 0) + int(parts[1]) * MIB
    found = [used[p] for p in pids if p in used]
    return sum(found) if found else None


class PeakMemory:
    """Samples a process tree on a background thread until :meth:`stop`; the peaks are its result."""

    def __init__(self, interval_s: float = 0.2, gpu_interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.gpu_every = max(1, round(gpu_interval_s / interval_s))
        self.peak_rss_bytes: int | None = None
        self.peak_gpu_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._smi = shutil.which("nvidia-smi")

    def watch(self, pid: int) -> None:
        """Start sampling ``pid`` and its children (once; later calls do nothing)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, args=(pid,), daemon=True, name="peak-memory")
        self._thread.start()

    def _sample(self, pid: int, with_gpu: bool) -> None:
        rss, pids = tree_rss_bytes(pid)
        if pids:
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, rss)
        if with_gpu:
            gpu = gpu_bytes(pids, self._smi)
            if gpu is not None:
                self.peak_gpu_bytes = max(self.peak_gpu_bytes or 0, gpu)

    def _run(self, pid: int) -> None:
        tick = 0
        while True:
            self._sample(pid, tick % self.gpu_every == 0)
            tick += 1
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> dict:
        """Stop sampling; ``{"peak_rss_bytes": int|None, "peak_gpu_bytes": int|None}``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        return {"peak_rss_bytes": self.peak_rss_bytes, "peak_gpu_bytes": self.peak_gpu_bytes}
