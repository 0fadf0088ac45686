"""Tests of dpcourse.backend.gpuinfo: the device total from nvidia-smi, with a stand-in nvidia-smi."""

import os
import stat

import pytest

from dpcourse.backend import gpuinfo


def test_parse_memory_totals_in_mib():
    # An H200 as nvidia-smi reports it (shared/baselines/README.md): 143,771 MiB.
    assert gpuinfo.parse_memory_totals("143771\n143771\n") == [143_771 * 2**20] * 2
    assert gpuinfo.parse_memory_totals("") == []


def test_parse_rejects_what_is_not_mib():
    with pytest.raises(ValueError, match="N/A"):
        gpuinfo.parse_memory_totals("[N/A]\n")


@pytest.mark.parametrize("totals, expected", [(None, None), ([], None), ([5, 5], 5), ([5, 6], None)])
def test_uniform_gpu_memory(totals, expected):
    assert gpuinfo.uniform_gpu_memory(totals) == expected


def _fake_nvidia_smi(tmp_path, body):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


def test_gpu_memory_totals_reads_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, "echo 23034; echo 23034") + os.pathsep + "/usr/bin:/bin")
    assert gpuinfo.gpu_memory_totals() == [23_034 * 2**20] * 2


def test_gpu_memory_totals_is_none_when_nvidia_smi_fails_or_is_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, "exit 9") + os.pathsep + "/usr/bin:/bin")
    assert gpuinfo.gpu_memory_totals() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpuinfo.gpu_memory_totals() is None
