"""Lesson 01's compilation-cache cell leaves the kernel as it found it: the scratch cache is no longer used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cache_cell() -> str:
    cells = (ROOT / "notebooks" / "01_setup.py").read_text().split("\n# %%")
    (cell,) = [c for c in cells if "jax_compilation_cache_dir" in c and "mkdtemp" in c]
    return cell.split("\n", 1)[1]


@pytest.mark.slow
def test_after_the_cache_cell_a_compile_writes_to_no_cache_and_warns_of_no_deleted_folder(tmp_path):
    after = (
        "import warnings\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)  # any compile would be stored\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    jax.jit(lambda v: jnp.sin(v) + 3.0)(jnp.ones(5)).block_until_ready()\n"
        "print('WARNINGS', [str(w.message)[:200] for w in caught])\n"
        "print('DIR', jax.config.jax_compilation_cache_dir)\n"
    )
    code = "import os\n" + cache_cell() + "\n" + after
    env = dict(os.environ, JAX_PLATFORMS="cpu", TMPDIR=str(tmp_path))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "WARNINGS []" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "DIR None" in out.stdout
    assert not list(tmp_path.iterdir())  # the scratch folder is gone and nothing wrote into it again
