"""dpcourse.checkpoints.scratch: notebook 11's temporary folder made where there is room, its copies said in one sentence."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections import namedtuple

import pytest

from dpcourse import config, model
from dpcourse.checkpoints import checkpoint, scratch

Usage = namedtuple("Usage", "total used free")


def test_a_folder_is_made_where_there_is_room(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = scratch.scratch_folder("ckpt-", 1000)
    assert folder.parent == tmp_path and folder.is_dir()


def test_a_temporary_folder_without_room_is_one_sentence_naming_it_and_tmpdir(tmp_path, monkeypatch):
    """Lesson 11 with a full temporary folder: a raw shutil.Error from a cell half-way, and --out blamed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 5 * 10**5, 5 * 10**5))
    with pytest.raises(checkpoint.CheckpointError) as caught:
        scratch.scratch_folder("ckpt-", 20 * 10**6)
    said = str(caught.value)
    assert said.startswith(f"The temporary folder {tmp_path} has 0.5 MB free, and this lesson writes about 20.0 MB")
    assert "TMPDIR" in said and len(said.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_no_usable_temporary_folder_is_one_sentence(monkeypatch):
    """With 0 bytes free: "No usable temporary directory found", a traceback, before."""
    monkeypatch.setattr(tempfile, "tempdir", None)

    def none_usable():
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    with pytest.raises(checkpoint.CheckpointError, match="There is no usable temporary folder .*TMPDIR"):
        scratch.scratch_folder("ckpt-", 1000)


def test_a_temporary_folder_that_cannot_be_written_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ckpt-x"))

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", read_only)
    with pytest.raises(checkpoint.CheckpointError, match=f"temporary folder {tmp_path}: the directory cannot be"):
        scratch.scratch_folder("ckpt-", 1000)


def test_a_copy_that_fails_on_a_full_disk_is_removed_and_said_naming_the_destination(tmp_path, monkeypatch):
    source = tmp_path / "source"
    (source / "3").mkdir(parents=True)
    for name in "abc":
        (source / "3" / name).write_text(name)
    real = shutil.copy2

    def full_after_one(src, dst, **kwargs):
        if os.path.basename(src) != "a":
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return real(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copy2", full_after_one)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        scratch.copy_folder(source, tmp_path / "copy")
    said = str(caught.value)
    assert said.startswith(f"Could not copy {source} to {tmp_path / 'copy'}: no room left") and "shutil" not in said
    assert not (tmp_path / "copy").exists()
    monkeypatch.undo()
    assert sorted(p.name for p in (scratch.copy_folder(source, tmp_path / "copy") / "3").iterdir()) == ["a", "b", "c"]


def test_the_room_the_lesson_asks_for_covers_every_step_it_keeps():
    smoke = config.make_config("smoke")
    step = 12 * model.param_count(smoke) + scratch.STEP_OVERHEAD_BYTES
    other = 12 * model.param_count(config.make_config("cpu")) + scratch.STEP_OVERHEAD_BYTES
    assert scratch.lesson_bytes(smoke) == scratch.LESSON_STEPS_ON_DISK * step + other
