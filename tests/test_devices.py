"""Tests of dpcourse.devices: simulated devices set before JAX starts, and the clear errors.

The test process itself already runs JAX on 8 simulated CPU devices
(conftest.py), so every test about what happens at backend start runs a
fresh ``python -c`` with an environment built here.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from dpcourse import devices
from dpcourse.devices import CPU_COUNT_FLAG

slow = pytest.mark.slow  # starts a Python process that imports JAX


def run_fresh(python_exe: str, code: str, **env_overrides: str) -> dict:
    """Run ``code`` in a new interpreter; it must print one JSON line last.

    The child's environment is this one without the variables the test
    process set for itself (``XLA_FLAGS`` from conftest.py and the
    backend-start variables), plus ``env_overrides``. ``JAX_PLATFORMS=cpu``
    keeps the result the same on a GPU machine.
    """
    env = {k: v for k, v in os.environ.items() if k not in devices.BACKEND_START_VARIABLES}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_overrides)
    out = subprocess.run(
        [python_exe, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, f"child failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@slow
def test_setup_appends_to_existing_xla_flags(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json, os
        from dpcourse import devices
        n = devices.setup_devices(4)
        import jax
        print(json.dumps({"n": n, "flags": os.environ["XLA_FLAGS"], "cpus": len(jax.devices("cpu"))}))
    """,
        XLA_FLAGS="--xla_cpu_enable_fast_math=false --xla_dump_to=/tmp/unused",
    )
    assert result["n"] == 4 and result["cpus"] == 4
    flags = result["flags"].split()
    # The learner's flags are still there, in order, and the count was added.
    assert flags[:2] == ["--xla_cpu_enable_fast_math=false", "--xla_dump_to=/tmp/unused"]
    assert f"{CPU_COUNT_FLAG}=4" in flags


@slow
def test_user_set_device_count_wins(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json, os
        from dpcourse import devices
        n = devices.setup_devices(8)
        import jax
        print(json.dumps({"n": n, "flags": os.environ["XLA_FLAGS"], "cpus": len(jax.devices("cpu"))}))
    """,
        XLA_FLAGS=f"{CPU_COUNT_FLAG}=3",
    )
    assert result == {"n": 3, "flags": f"{CPU_COUNT_FLAG}=3", "cpus": 3}


@slow
def test_late_setup_with_another_count_says_restart_and_same_count_is_fine(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        devices.setup_devices(2)
        import jax
        jax.devices()  # the backend starts here
        same = devices.setup_devices(2)  # re-running the setup cell
        try:
            devices.setup_devices(4)
            err = None
        except devices.DeviceSetupError as e:
            err = str(e)
        print(json.dumps({"same": same, "err": err, "cpus": len(jax.devices("cpu"))}))
    """,
    )
    assert result["same"] == 2 and result["cpus"] == 2
    assert result["err"] is not None, "asking for 4 devices after start must raise"
    assert "Restart the kernel" in result["err"]
    assert "2 CPU device(s)" in result["err"] and "4" in result["err"]


@slow
def test_too_few_devices_for_a_lesson_gives_the_simulated_devices_hint(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        devices.setup_devices(1)
        try:
            devices.lesson_devices(2)
            err = None
        except devices.DeviceSetupError as e:
            err = str(e)
        print(json.dumps({"err": err}))
    """,
    )
    err = result["err"]
    assert err is not None
    assert "at least 2 devices" in err and "1 CPU device(s)" in err
    assert devices.SIMULATED_DEVICES_HINT in err
    assert "setup_devices(n_cpu_devices=8)" in err and CPU_COUNT_FLAG in err


@slow
def test_settings_changed_after_start_are_detected(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json, os
        from dpcourse import devices
        devices.setup_devices(2)
        import jax
        jax.devices()
        before = devices.settings_changed_after_start()
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.5"
        after = devices.settings_changed_after_start()
        print(json.dumps({"before": before, "after": after}))
    """,
    )
    assert result == {"before": [], "after": ["XLA_PYTHON_CLIENT_MEM_FRACTION"]}


# In-process tests: conftest.py configured 8 CPU devices.


def test_setup_again_with_the_same_count_in_this_process(cpu_devices):
    assert devices.setup_devices(8) == 8


def test_setup_rejects_a_count_below_one():
    with pytest.raises(ValueError, match=">= 1"):
        devices.setup_devices(0)


def test_device_report_fields(cpu_devices):
    import jax
    import jaxlib
    import optax

    report = devices.device_report()
    assert report.jax == jax.__version__ and report.jaxlib == jaxlib.__version__
    assert report.optax == optax.__version__
    assert report.python.count(".") == 2
    assert report.backend == jax.default_backend()
    assert report.process_count == 1
    assert report.cpu_device_count == 8
    assert report.device_count == len(jax.devices())
    assert [d.id for d in report.devices] == [d.id for d in jax.devices()]
    for info in report.devices:
        assert info.process_index == 0
        assert info.memory_bytes is None or info.memory_bytes > 0
    if report.backend == "cpu":
        assert report.device_kind == "cpu"
        assert all(d.platform == "cpu" for d in report.devices)


def test_lesson_devices_on_simulated_cpus_are_labelled(cpu_devices):
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("on an accelerator the default devices are used")
    chosen = devices.lesson_devices(2)
    assert chosen.count == 8 and chosen.simulated
    assert "simulated" in chosen.label and "8" in chosen.label


def test_settings_unchanged_in_this_process(cpu_devices):
    assert devices.settings_changed_after_start() == []


def test_gpu_topology_is_none_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.gpu_topology() is None


@slow
def test_a_user_set_count_wins_and_a_late_request_for_another_is_still_refused(python_exe):
    # Notebook 01 does this: setup (the user's XLA_FLAGS wins), start JAX, then ask for one more.
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        n = devices.setup_devices(8)
        import jax
        have = len(jax.devices("cpu"))
        again = devices.setup_devices(8)  # re-running the first cell
        try:
            devices.setup_devices(n + 1)
            refused = ""
        except devices.DeviceSetupError as err:
            refused = str(err)
        print(json.dumps({"n": n, "have": have, "again": again, "refused": refused}))
    """,
        XLA_FLAGS="--xla_force_host_platform_device_count=3",
    )
    assert result["n"] == result["have"] == result["again"] == 3
    assert "Restart the kernel" in result["refused"]


@slow
def test_too_few_devices_from_the_users_flag_names_that_flag(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        devices.setup_devices(8)
        try:
            devices.lesson_devices(2)
            message = ""
        except devices.DeviceSetupError as err:
            message = str(err)
        print(json.dumps({"message": message}))
    """,
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
    )
    assert "Your XLA_FLAGS sets --xla_force_host_platform_device_count=1" in result["message"]


@pytest.mark.parametrize("bad", ["0", "-2", "abc"])
def test_a_bad_count_in_xla_flags_is_a_clear_error(bad, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count={bad}")
    with pytest.raises(devices.DeviceSetupError, match="not a positive whole number"):
        devices.setup_devices(8)


@pytest.mark.parametrize("bad", [2.5, True, "8"])
def test_setup_rejects_a_count_that_is_not_an_int(bad):
    with pytest.raises(ValueError, match="int >= 1"):
        devices.setup_devices(bad)
