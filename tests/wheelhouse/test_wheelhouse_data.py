"""Fashion-MNIST beside the wheels (tools/wheelhouse_data.py): packed from the cache, unpacked on a laptop, md5-checked."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "wheelhouse_data.py"
spec = importlib.util.spec_from_file_location("wheelhouse_data", SCRIPT)
wd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A data cache holding two files with md5s the module is told are the published ones."""
    folder = tmp_path / "cache"
    folder.mkdir()
    published = {}
    for name in wd.data.TRAIN_FILES:
        (folder / name).write_bytes(name.encode() * 100)
        published[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
    monkeypatch.setattr(wd.data, "MD5", published)
    return folder


def test_pack_then_unpack_carries_the_files_to_an_empty_cache(cache, tmp_path):
    stick = tmp_path / "wheelhouse"
    assert wd.pack(stick, cache) == list(wd.data.TRAIN_FILES)
    laptop = tmp_path / "laptop-cache"
    assert wd.unpack(stick, laptop) == list(wd.data.TRAIN_FILES)
    assert all((laptop / n).read_bytes() == (cache / n).read_bytes() for n in wd.data.TRAIN_FILES)
    assert wd.unpack(stick, laptop) == []  # already there: left as it is


def test_a_file_with_another_md5_is_refused_and_not_copied(cache, tmp_path):
    (cache / wd.data.TRAIN_FILES[0]).write_bytes(b"damaged")
    with pytest.raises(ValueError, match="not the published"):
        wd.pack(tmp_path / "wheelhouse", cache)
    assert not (tmp_path / "wheelhouse" / wd.FOLDER / wd.data.TRAIN_FILES[0]).exists()


def test_an_empty_cache_packs_nothing_and_says_how_to_fill_it(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "pack", "--dest", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"DPCOURSE_DATA_DIR": str(tmp_path / "empty"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "has no Fashion-MNIST files" in done.stdout


def test_a_cache_with_one_file_missing_is_refused_naming_it(cache, tmp_path):
    (cache / wd.data.TRAIN_FILES[1]).unlink()
    with pytest.raises(ValueError, match=f"not {wd.data.TRAIN_FILES[1]}.*Nothing was copied"):
        wd.pack(tmp_path / "wheelhouse", cache)
    assert not (tmp_path / "wheelhouse").exists()


def test_pack_on_the_command_line_refuses_half_the_data_with_status_2(cache, tmp_path):
    (cache / wd.data.TRAIN_FILES[0]).unlink()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "pack", "--dest", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"DPCOURSE_DATA_DIR": str(cache), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and wd.data.TRAIN_FILES[0] in done.stderr, done.stderr
    assert not (tmp_path / "w").exists()


def test_a_damaged_second_file_leaves_the_first_uncopied(cache, tmp_path):
    (cache / wd.data.TRAIN_FILES[1]).write_bytes(b"damaged")
    with pytest.raises(ValueError, match="not the published"):
        wd.pack(tmp_path / "wheelhouse", cache)
    assert not (tmp_path / "wheelhouse").exists()


def test_unpack_refuses_half_a_wheelhouse_unless_the_cache_has_the_rest(cache, tmp_path):
    stick = tmp_path / "wheelhouse"
    wd.pack(stick, cache)
    (stick / wd.FOLDER / wd.data.TRAIN_FILES[1]).unlink()
    laptop = tmp_path / "laptop"
    with pytest.raises(ValueError, match=wd.data.TRAIN_FILES[1]):
        wd.unpack(stick, laptop)
    assert not laptop.exists() or not any(laptop.iterdir())
    laptop.mkdir(exist_ok=True)
    (laptop / wd.data.TRAIN_FILES[1]).write_bytes((cache / wd.data.TRAIN_FILES[1]).read_bytes())
    assert wd.unpack(stick, laptop) == [wd.data.TRAIN_FILES[0]]
