"""Peak memory of a process tree: RSS summed over children, GPU memory parsed from nvidia-smi's listing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from coursetools import memwatch

HOLD = (
    "import sys, time\n"
    "block = bytearray(int(sys.argv[1]) * 1024 * 1024)\n"
    "for i in range(0, len(block), 4096): block[i] = 1\n"
    "print('ready', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def test_the_peak_counts_the_children_and_outlives_them():
    # A parent holding 60 MiB starts a child holding 120 MiB: the peak holds both.
    parent_code = (
        HOLD.replace("time.sleep(float(sys.argv[2]))", "")
        + "import subprocess\n"
        + f"child = subprocess.Popen([sys.executable, '-c', {HOLD!r}, '120', '1.5'], stdout=subprocess.PIPE)\n"
        + "child.stdout.readline(); print('both', flush=True); child.wait()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", parent_code, "60"], stdout=subprocess.PIPE, text=True)
    watcher = memwatch.PeakMemory(interval_s=0.05)
    watcher.watch(process.pid)
    assert process.stdout.readline().strip() == "ready"
    assert process.stdout.readline().strip() == "both"
    time.sleep(0.5)
    process.wait(timeout=30)
    peaks = watcher.stop()
    assert peaks["peak_rss_bytes"] >= 180 * memwatch.MIB, peaks
    assert peaks["peak_rss_bytes"] < 1024 * memwatch.MIB, peaks


def test_a_process_that_is_gone_measures_nothing():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert memwatch.tree_rss_bytes(process.pid) == (0, [])
    watcher = memwatch.PeakMemory(interval_s=0.05)
    watcher.watch(process.pid)
    time.sleep(0.2)
    assert watcher.stop() == {"peak_rss_bytes": None, "peak_gpu_bytes": None}


def test_gpu_memory_is_summed_over_the_trees_processes_from_nvidia_smis_listing(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '101, 2048'\necho '202, 512'\necho '303, 7'\necho 'No running processes found'\n")
    fake.chmod(0o755)
    assert memwatch.gpu_bytes([101, 202], str(fake)) == 2560 * memwatch.MIB
    assert memwatch.gpu_bytes([404], str(fake)) is None
    assert memwatch.gpu_bytes([101], None) is None
    assert memwatch.gpu_bytes([101], str(tmp_path / "missing")) is None


def test_this_process_has_a_resident_set():
    rss, pids = memwatch.tree_rss_bytes(os.getpid())
    assert rss > 10 * memwatch.MIB and pids[0] == os.getpid()
