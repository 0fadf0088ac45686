"""Tests of dpcourse.devices: simulated devices set before JAX starts, and the clear errors.

The test process itself already runs JAX on 8 simulated CPU devices
(conftest.py), so every test about what happens at backend start runs a
fresh ``python -c`` with an environment built here.
"""

from __future__ import annotations

import json
import os
import shutil
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
    # the learner's own setting is named, not a generic call they never made
    assert "asked for 1 simulated CPU device(s)" in err and "N_CPU_DEVICES" in err and "at least 2" in err


@slow
def test_too_few_devices_without_setup_gives_the_simulated_devices_hint(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        try:
            devices.lesson_devices(2)
            err = None
        except devices.DeviceSetupError as e:
            err = str(e)
        print(json.dumps({"err": err}))
    """,
        XLA_FLAGS="",
    )
    err = result["err"]
    assert err is not None and devices.SIMULATED_DEVICES_HINT in err
    assert "setup_devices(n_cpu_devices=8)" in err and CPU_COUNT_FLAG in err


@slow
def test_jax_platforms_set_after_import_is_refused_by_name(python_exe):
    # JAX reads JAX_PLATFORMS at import; setting it later did nothing, silently.
    result = run_fresh(
        python_exe,
        """
        import json, os
        os.environ.pop("JAX_PLATFORMS", None)
        import jax
        os.environ["JAX_PLATFORMS"] = "cpu"
        from dpcourse import devices
        try:
            n = devices.setup_devices(4)
            err = None
        except devices.DeviceSetupError as e:
            n, err = None, str(e)
        print(json.dumps({"n": n, "err": err}))
    """,
    )
    assert result["n"] is None and result["err"] is not None
    assert "JAX_PLATFORMS='cpu'" in result["err"]
    assert "before importing jax" in result["err"]


@slow
def test_jax_platforms_set_before_import_is_accepted(python_exe):
    result = run_fresh(
        python_exe,
        """
        import json
        import jax
        from dpcourse import devices
        print(json.dumps({"n": devices.setup_devices(3), "cpus": len(jax.devices("cpu"))}))
    """,
    )
    assert result == {"n": 3, "cpus": 3}


@slow
def test_a_platform_the_machine_lacks_names_jax_platforms_not_a_bare_assert(python_exe):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA GPU: JAX_PLATFORMS=cuda may well start")
    # JAX_PLATFORMS=cuda without a visible GPU ended in "AssertionError:" with no text,
    # both in dpcourse's own calls and in the learner's first JAX operation.
    result = run_fresh(
        python_exe,
        """
        import json
        from dpcourse import devices
        devices.setup_devices(2)
        import jax.numpy as jnp
        seen = []
        for start in (lambda: jnp.ones(3), devices.device_report, lambda: devices.lesson_devices(2)):
            try:
                start()
                seen.append(None)
            except Exception as e:
                seen.append([type(e).__name__, str(e)])
        print(json.dumps({"seen": seen}))
    """,
        JAX_PLATFORMS="cuda",
    )
    for name, message in result["seen"]:
        assert name == "DeviceSetupError"
        assert "JAX_PLATFORMS='cuda'" in message and "Unset JAX_PLATFORMS" in message


def test_a_bare_assertion_from_the_backend_becomes_a_clear_error(monkeypatch):
    # As JAX fails with JAX_PLATFORMS=cuda on a machine without a GPU:
    # xla_bridge.backends() ends in `assert _default_backend is not None`.
    import jax

    def no_backend(*args, **kwargs):
        raise AssertionError()

    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setattr(jax, "devices", no_backend)
    with pytest.raises(devices.DeviceSetupError) as err:
        devices.start_backend()
    message = str(err.value)
    assert "JAX_PLATFORMS='cuda'" in message and "Unset JAX_PLATFORMS" in message
    assert "AssertionError" not in message.split("(")[0]
    assert 'pip install "jax[cuda12]"' in message


def test_a_backend_failure_without_jax_platforms_says_how_to_skip_a_plugin(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    message = devices.backend_failure_message(RuntimeError("Unable to initialize backend 'cuda'"))
    assert "Unable to initialize backend 'cuda'" in message and "JAX_PLATFORMS=cpu" in message


@slow
def test_only_changes_after_the_backend_started_are_reported(python_exe):
    # a change after setup_devices but before the first JAX operation takes
    # effect and must not be reported; one after the first operation must be.
    result = run_fresh(
        python_exe,
        """
        import json, os
        from dpcourse import devices
        devices.setup_devices(2)
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
        not_started = devices.settings_changed_after_start()
        import jax.numpy as jnp
        jnp.ones(3).block_until_ready()  # the backend starts here, not in dpcourse
        in_time = devices.settings_changed_after_start()
        os.environ["XLA_CLIENT_MEM_FRACTION"] = "0.5"
        too_late = devices.settings_changed_after_start()
        print(json.dumps({"not_started": not_started, "in_time": in_time, "too_late": too_late}))
    """,
    )
    assert result == {"not_started": [], "in_time": [], "too_late": ["XLA_CLIENT_MEM_FRACTION"]}


@slow
def test_preallocation_is_off_by_default_and_a_learner_setting_wins(python_exe):
    code = """
        import json, os
        from dpcourse import devices
        devices.setup_devices(2)
        print(json.dumps({"value": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
                          "ours": devices.preallocation_switched_off()}))
    """
    assert run_fresh(python_exe, code) == {"value": "false", "ours": True}
    assert run_fresh(python_exe, code, XLA_PYTHON_CLIENT_PREALLOCATE="true") == {"value": "true", "ours": False}
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=true" in devices.PREALLOCATION_NOTE


def test_both_memory_fraction_names_are_refused_before_start(monkeypatch):
    # XLA_PYTHON_CLIENT_MEM_FRACTION is the deprecated name of XLA_CLIENT_MEM_FRACTION;
    # jaxlib refuses a GPU start with both. The test process has started, so check the refusal
    # through a process-state stand-in: a backend that has not started yet.
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.5")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    monkeypatch.setattr(devices, "backend_started", lambda: False)
    monkeypatch.setattr(devices, "_requested", devices._requested)
    with pytest.raises(devices.DeviceSetupError) as err:
        devices.setup_devices(8)
    message = str(err.value)
    assert "XLA_CLIENT_MEM_FRACTION='0.5'" in message and "XLA_PYTHON_CLIENT_MEM_FRACTION='0.6'" in message
    assert "deprecated" in message and "unset XLA_PYTHON_CLIENT_MEM_FRACTION" in message


def test_both_memory_fraction_names_are_watched():
    assert {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"} <= set(devices.BACKEND_START_VARIABLES)


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


def test_on_a_one_gpu_host_lessons_get_the_cpu_devices_explicitly(cpu_devices, monkeypatch):
    # a stand-in for a host whose default backend is one GPU.
    import jax

    class FakeGpu:
        platform, device_kind, id, process_index = "gpu", "NVIDIA H200", 0, 0

    real_devices = jax.devices

    def fake_devices(backend=None):
        return [FakeGpu()] if backend is None else real_devices(backend)

    monkeypatch.setattr(jax, "devices", fake_devices)
    chosen = devices.lesson_devices(2)
    assert chosen.devices == list(cpu_devices) and chosen.simulated
    assert all(d.platform == "cpu" for d in chosen.devices)


def test_on_a_cpu_host_the_default_device_is_left_as_it_is(cpu_devices):
    """keep_arrays_on changes JAX's default device only where the default backend is not the lesson's (test_lesson.py)."""
    import jax

    assert devices.keep_arrays_on(list(cpu_devices)) is None
    assert jax.config.jax_default_device is None
