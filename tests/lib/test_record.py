"""Tests of dpcourse.record: the recorder behind results.json."""

import json

import numpy as np
import pytest

from dpcourse import record as results

CONTEXT = dict(
    notebook="04_sharding",
    profile="smoke",
    data_source="synthetic",
    backend="cpu",
    device_kind="cpu",
    device_count=8,
    jax_version="0.10.2",
)
FIELDS = {
    "notebook",
    "metric",
    "value",
    "unit",
    "profile",
    "data_source",
    "backend",
    "device_kind",
    "device_count",
    "jax_version",
}


@pytest.fixture(autouse=True)
def fresh_context(monkeypatch):
    """Each test starts with no context (it is process-wide state)."""
    monkeypatch.setattr(results, "_context", {})


def test_record_is_a_no_op_when_not_enabled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results.set_context(**CONTEXT)
    assert results.active_path() is None
    assert results.record("examples_per_s", 123.0, "examples/s") is None
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


def test_enable_writes_json_lines_with_every_field(tmp_path):
    path = tmp_path / "sub" / "records.jsonl"
    results.enable(path)
    results.set_context(**CONTEXT)
    rec = results.record("examples_per_s", 1234.5, "examples/s")
    results.record("final_loss", np.float32(0.25), "")
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert set(first) == FIELDS
    assert first == {**CONTEXT, "metric": "examples_per_s", "value": 1234.5, "unit": "examples/s"}
    assert rec.value == 1234.5 and rec.device_count == 8
    assert second["value"] == 0.25 and isinstance(second["value"], float)  # numpy scalar -> JSON number


def test_environment_variable_turns_recording_on(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    monkeypatch.setenv(results.RESULTS_ENV, str(path))
    results.set_context(**CONTEXT)
    results.record("ratio", 0.5, "x")
    assert results.read_records(path)[0]["metric"] == "ratio"


def test_enable_wins_over_the_environment_and_disable_stops(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path / "env.jsonl"))
    results.enable(tmp_path / "mine.jsonl")
    assert results.active_path() == tmp_path / "mine.jsonl"
    results.disable()
    assert results.active_path() == tmp_path / "env.jsonl"


@pytest.mark.parametrize("value, stored", [(float("nan"), "nan"), (float("inf"), "inf"), (np.float64("-inf"), "-inf")])
def test_non_finite_values_are_stored_as_strings(tmp_path, value, stored):
    path = tmp_path / "r.jsonl"
    results.enable(path)
    results.set_context(**CONTEXT)
    results.record("final_loss", value, "")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text  # valid JSON for any reader
    assert json.loads(text)["value"] == stored


def test_overrides_replace_context_fields_for_one_record(tmp_path):
    path = tmp_path / "r.jsonl"
    results.enable(path)
    results.set_context(**CONTEXT)
    results.record("examples_per_s", 10.0, "examples/s", device_count=1)
    results.record("examples_per_s", 20.0, "examples/s")
    first, second = results.read_records(path)
    assert first["device_count"] == 1 and second["device_count"] == 8


def test_set_context_fills_in_the_jax_version(tmp_path):
    import jax

    results.enable(tmp_path / "r.jsonl")
    results.set_context(**{k: v for k, v in CONTEXT.items() if k != "jax_version"})
    assert results.record("x", 1, "").jax_version == jax.__version__


def test_record_without_context_is_a_clear_error(tmp_path):
    results.enable(tmp_path / "r.jsonl")
    with pytest.raises(RuntimeError, match=r"set_context\(\)") as err:
        results.record("examples_per_s", 1.0, "examples/s")
    assert "notebook" in str(err.value)
    assert not (tmp_path / "r.jsonl").exists()


def test_read_records_missing_file_is_empty(tmp_path):
    assert results.read_records(tmp_path / "absent.jsonl") == []


def test_read_records_bad_line_names_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"metric": "a"}\n\n{"metric": "b"}\n{"metric": truncated\n')
    with pytest.raises(ValueError) as err:
        results.read_records(path)
    assert f"{path}:4:" in str(err.value)


def test_read_records_skips_blank_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"metric": "a"}\n\n{"metric": "b"}\n')
    assert [r["metric"] for r in results.read_records(path)] == ["a", "b"]


def test_write_json_atomic_replaces_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out" / "results.json"
    results.write_json_atomic(target, {"schema": 1, "value": 1})
    returned = results.write_json_atomic(target, {"schema": 1, "value": 2})
    assert returned == target
    assert json.loads(target.read_text()) == {"schema": 1, "value": 2}
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]


def test_write_json_atomic_keeps_the_old_file_when_the_payload_is_not_json(tmp_path):
    target = tmp_path / "results.json"
    results.write_json_atomic(target, {"ok": True})
    with pytest.raises(TypeError):
        results.write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_output_dir_sits_beside_the_records(tmp_path, monkeypatch):
    results.set_context("09_performance", "smoke", "synthetic", "cpu", "cpu", 1, "0.0")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(results.RESULTS_ENV, raising=False)
    # Recording off (in the lab): results/ in the working folder, the notebook's.
    assert results.output_dir() == tmp_path / "results" and (tmp_path / "results").is_dir()
    assert results.output_dir("trace") == tmp_path / "results" / "09_performance_trace"
    results.enable(tmp_path / "records.jsonl")
    folder = results.output_dir("trace")
    assert folder == tmp_path / "09_performance_trace" and folder.is_dir()


def test_a_folder_written_through_whole_folder_is_whole_or_absent(tmp_path):
    import errno

    from dpcourse import record as rec

    target = tmp_path / "09_performance_trace"
    with rec.whole_folder(target) as fresh:
        (fresh / "plugins" / "profile").mkdir(parents=True)
        (fresh / "plugins" / "profile" / "trace.json.gz").write_bytes(b"whole")
    assert (target / "plugins" / "profile" / "trace.json.gz").read_bytes() == b"whole"
    with pytest.raises(OSError), rec.whole_folder(target) as fresh:
        (fresh / "perfetto_trace.json.gz").write_bytes(b"x" * 655360)
        raise OSError(errno.ENOSPC, "No space left on device")  # the profiler met a full disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["09_performance_trace"]  # no scratch folder left
    assert not (target / "perfetto_trace.json.gz").exists()


def test_a_record_that_meets_a_full_disk_leaves_no_half_line(tmp_path, monkeypatch):
    import builtins
    import errno

    from dpcourse import record as rec

    path = tmp_path / "records.jsonl"
    rec.enable(path)
    rec.set_context(
        notebook="09_performance",
        profile="smoke",
        data_source="synthetic",
        backend="cpu",
        device_kind="cpu",
        device_count=8,
        jax_version="test",
    )
    rec.record("examples_per_s", 1.0, "examples/s")
    real_open = builtins.open

    class HalfWriter:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def tell(self):
            return self.fh.tell()

        def truncate(self, size):
            return self.fh.truncate(size)

        def write(self, text):
            self.fh.write(text[:7])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            self.fh.flush()

    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: HalfWriter(real_open(p, *a, **k)))
    with pytest.raises(OSError):
        rec.record("final_loss", 0.5, "")
    monkeypatch.undo()
    assert [r["metric"] for r in rec.read_records(path)] == ["examples_per_s"]
    rec.disable()
