"""Tests of dpcourse.show: escaped HTML tables, banners and charts."""

import base64
import sys

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dpcourse import show as display  # noqa: E402
from dpcourse.bench import BenchResult  # noqa: E402

EVIL = "<script>alert(1)</script>"


def test_table_escapes_cells_headers_and_caption():
    t = display.table([{"name": EVIL, "<b>col</b>": 1}], caption=f"caption {EVIL}")
    html = t._repr_html_()
    assert "<script>" not in html and "<b>col</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("&lt;script&gt;") == 2  # cell and caption
    assert "&lt;b&gt;col&lt;/b&gt;" in html


def test_table_formats_numbers_and_none():
    t = display.table(
        [{"examples/s": 12345.678, "bytes": 7454760, "mfu": None, "loss": 0.123456, "tiny": 1e-7, "flag": True}]
    )
    plain = repr(t)
    assert "12,346" in plain  # thousands separators, no false precision
    assert "7,454,760" in plain
    assert "n/a" in plain  # unknown MFU is shown as such, not as None or 0
    assert "0.1235" in plain
    assert "1.000e-07" in plain
    assert "True" in plain
    assert "<td>n/a</td>" in t._repr_html_()


def test_table_plain_text_repr_lines_up_columns():
    t = display.table([{"a": 1, "bb": "x"}, {"a": 22222, "bb": "yy"}], caption="Cap")
    lines = str(t).splitlines()
    assert lines[0] == "Cap"
    assert lines[1].split() == ["a", "bb"]
    assert len({line.index(col) for line, col in zip(lines[1:], ["bb", "x", "yy"])}) == 1  # same column


def test_table_with_chosen_columns_and_missing_keys():
    t = display.table([{"a": 1}], columns=["a", "b"])
    assert "n/a" in str(t)


def test_empty_table():
    assert "<table" in display.table([])._repr_html_()


def test_key_values():
    t = display.key_values({"parameters": 1_863_690, "<x>": "y"}, caption="Workload")
    assert "1,863,690" in str(t)
    assert "&lt;x&gt;" in t._repr_html_()


def test_banner_escapes_and_has_a_plain_form():
    b = display.banner(f"bad {EVIL}", "error")
    assert "<script>" not in b._repr_html_() and "ERROR" in b._repr_html_()
    assert str(b) == f"[ERROR] bad {EVIL}"


def test_data_banner_says_synthetic_loudly():
    b = display.data_banner("synthetic", "No network.")
    assert "SYNTHETIC" in str(b) and "No network." in str(b)
    assert "[WARNING]" in str(b)
    assert "not comparable" in str(b)


def test_synthetic_banner_is_one_line_with_the_download_errors_one_click_away():
    why = "Real data unavailable: Could not download train-images-idx3-ubyte.gz: <urlopen error [Errno -2]>"
    b = display.data_banner("synthetic", why)
    html_text = b._repr_html_()
    head, _, folded = html_text.partition("<details>")
    assert "urlopen" not in head and "urlopen" in folded and "</details>" in folded
    assert str(b).splitlines()[0].count("SYNTHETIC") == 1 and "urlopen" not in str(b).splitlines()[0]


def test_data_banner_for_real_data_is_a_note():
    b = display.data_banner("real", "Fashion-MNIST training set, md5-checked.")
    assert "SYNTHETIC" not in str(b) and str(b).startswith("[NOTE]")


def test_show_source_escapes_code():
    def sample():
        return "<tag>"

    shown = display.show_source(sample)
    assert "def sample" in str(shown)
    assert "&lt;tag&gt;" in shown._repr_html_()


def test_bar_chart_returns_a_figure_with_one_bar_per_label():
    fig = display.bar_chart(
        ["1 device", "8 devices"], [1000.0, 950.0], "examples/s", "Throughput", note="simulated devices never speed up"
    )
    try:
        assert isinstance(fig, matplotlib.figure.Figure)
        (ax,) = fig.axes
        assert [p.get_height() for p in ax.patches] == [1000.0, 950.0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1 device", "8 devices"]
        assert ax.get_ylabel() == "examples/s" and ax.get_title() == "Throughput"
        assert any("never speed up" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)


def test_records_table_names_the_data_source():
    r = BenchResult("baseline", 1, 128, 0.5, 10.0, 12800.0, 2.1, 0.3, [10.0], 10)
    t = display.records_table([r], data_source="synthetic")
    assert "synthetic" in str(t).splitlines()[0]  # caption
    assert "12,800" in str(t) and "baseline" in str(t)
    assert str(t).count("synthetic") == 2  # caption and the data column


@pytest.mark.parametrize("value, text", [(0.0, "0"), (1500.0, "1,500"), (2e6, "2.000e+06"), (-3, "-3")])
def test_number_formatting(value, text):
    assert display._fmt(value) == text


def test_show_figure_closes_the_figure_and_shows_it_once(monkeypatch):
    shown = []
    # The figure first: pyplot's first figure in a process picks its backend and asks IPython for a shell.
    fig, ax = plt.subplots()
    monkeypatch.setattr("IPython.get_ipython", lambda: object())
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    ax.plot([1, 2], [3, 4])
    display.show_figure(fig)
    display.show_figure(fig)  # a second call shows nothing more
    assert len(shown) == 1 and base64.b64decode(shown[0]["image/png"]).startswith(b"\x89PNG")
    assert shown[0]["text/plain"] == display.figure_text(fig)
    assert fig.number not in plt.get_fignums()  # the inline backend will not show it again


def test_a_figure_is_described_by_its_own_data():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4], label="measured")
    ax.plot([1, 2], [3.5, 4.5], label="_hidden")
    ax.set(title="Throughput", xlabel="global batch", ylabel="examples/s", xlim=(1, 2), ylim=(3, 5))
    ax.legend()
    assert display.figure_text(fig) == ("Throughput: global batch from 1 to 2, examples/s from 3 to 5; measured.")
    plt.close(fig)


def test_figures_shown_by_ipython_carry_their_description():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        assert display.describe_figures()
        fig, ax = plt.subplots()
        ax.set_title("Roofline")
        data, _ = shell.display_formatter.format(fig)
        assert data["text/plain"].startswith("Roofline: x from")  # the PNG comes from the inline backend
        plt.close(fig)
    finally:
        InteractiveShell.clear_instance()


def test_bar_chart_is_shown_unless_asked_not_to(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.get_ipython", lambda: object())
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    display.bar_chart(["a"], [1.0], "y", "t")
    quiet = display.bar_chart(["a"], [1.0], "y", "t", show=False)
    assert len(shown) == 1
    plt.close(quiet)


def test_figure_saves_the_png_beside_the_records_and_shows_it(tmp_path, monkeypatch):
    from dpcourse import record as results

    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path / "records.jsonl"))
    results.set_context("99_test", "smoke", "none", "cpu", "cpu", 1)
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    path = display.figure(fig, "chart")
    assert path == tmp_path / "99_test_chart.png" and path.read_bytes().startswith(b"\x89PNG")


def test_optional_widgets_without_ipywidgets_is_none_with_a_note(monkeypatch, capsys):
    # None in sys.modules makes `import ipywidgets` raise ImportError.
    monkeypatch.setitem(__import__("sys").modules, "ipywidgets", None)
    assert display.optional_widgets() is None
    out = capsys.readouterr().out
    assert "Interactive controls skipped" in out and "pip install ipywidgets" in out
    assert len(out.strip().splitlines()) == 1


def test_optional_widgets_with_ipywidgets_is_the_module():
    import ipywidgets

    assert display.optional_widgets() is ipywidgets


CHART_CELLS = [
    "import matplotlib.pyplot as plt\nfrom dpcourse import show\n"
    "fig, ax = plt.subplots()\nax.plot([1, 2], [3, 4])\nshow.figure(fig, 'line')",
    "fig = show.bar_chart(['1 device', '2 devices'], [1.0, 2.0], 'examples/s', 'Throughput')\nfig.savefig('bar.png')",
]


@pytest.mark.parametrize("backend", ["Agg", None])
def test_an_executed_notebook_shows_every_chart_once_whatever_the_backend(tmp_path, monkeypatch, backend):
    # with MPLBACKEND=Agg the executed notebook had no chart.
    import nbformat
    from nbclient import NotebookClient

    if backend is None:
        monkeypatch.delenv("MPLBACKEND", raising=False)
    else:
        monkeypatch.setenv("MPLBACKEND", backend)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in CHART_CELLS])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells:
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(images) == 1, cell.outputs
    assert (tmp_path / "bar.png").exists()  # the figure can still be saved after it was shown


# --------------------------------------------------------------------------
# show.sharding and show.shard_table: with and without rich, inside shard_map and jit


def _sharded(cpu_devices, shape=(8, 4)):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(cpu_devices), ("data",))
    x = jax.device_put(jnp.arange(float(np.prod(shape))).reshape(shape), NamedSharding(mesh, P("data")))
    return mesh, x


def test_sharding_without_rich_falls_back_to_per_device_shapes_with_one_install_line(cpu_devices, monkeypatch, capsys):
    """lessons 03 and 04 crashed with "visualize_sharding requires rich"."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    monkeypatch.setitem(sys.modules, "rich", None)  # and importing it fails, as without the package
    _, x = _sharded(cpu_devices)
    display.sharding(x, "x")
    out = capsys.readouterr().out
    assert out.count("pip install rich") == 1
    assert out.count("(1, 4)") == 8 and "cpu:7" in out  # each device's shard shape


def test_sharding_with_rich_draws_the_picture(cpu_devices, capsys):
    pytest.importorskip("rich")
    _, x = _sharded(cpu_devices)
    display.sharding(x, "x")
    out = capsys.readouterr().out
    assert "CPU 7" in out and "pip install rich" not in out


def test_sharding_of_rank_three_is_a_table(cpu_devices, capsys):
    _, x = _sharded(cpu_devices, (8, 2, 3))
    display.sharding(x, "stack")
    out = capsys.readouterr().out
    assert out.count("(1, 2, 3)") == 8 and "pip install rich" not in out


def test_inside_shard_map_each_device_prints_its_index_and_local_shape(cpu_devices, capsys):
    """visualize_array_sharding drew one replicated-looking box; shard_table raised."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh, x = _sharded(cpu_devices)
    notes = []

    def body(block):
        display.sharding(block, "block")
        notes.append(display.shard_table(block, "block"))
        return block * 2

    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(x).block_until_ready()
    jax.effects_barrier()
    out = capsys.readouterr().out
    for i in range(8):
        assert out.count(f"block: the device at data={i} holds a local block of shape (1, 4) float32") == 2
    assert "prints its own block" in repr(notes[0])


def test_inside_jit_alone_a_sentence_says_why_nothing_per_device_is_shown(cpu_devices, capsys):
    import jax

    _, x = _sharded(cpu_devices)
    notes = []

    def f(v):
        display.sharding(v, "v")
        notes.append(display.shard_table(v, "v"))
        return v + 1

    jax.jit(f)(x).block_until_ready()
    out = capsys.readouterr().out
    assert "traced by jit" in out and "traced by jit" in repr(notes[0])


def test_banners_are_grouped_into_one_box_a_line_each_with_the_worst_colour():
    note = display.banner("8 simulated CPU devices share this machine's CPU cores.", "note")
    data = display.data_banner("synthetic", "Real data unavailable: <urlopen error [Errno -2]>")
    group = display.banner_group([note, data])
    html_text = group._repr_html_()
    assert html_text.count('<div style="background') == 1  # one box
    assert "#fff4d6" in html_text  # coloured as a warning, the worst of the two
    assert "urlopen" not in html_text.partition("<details")[0] and "&lt;urlopen" in html_text
    lines = str(group).splitlines()
    assert lines[0].startswith("[NOTE] 8 simulated") and lines[1].startswith("[WARNING] SYNTHETIC DATA")
    assert display.banner_group([note]) is note
    assert display.banner_group([]) is None


def test_progress_without_tqdm_gives_the_items_and_one_line_on_what_tqdm_adds(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    assert list(display.progress([1, 2, 3], desc="ladder", unit="rung")) == [1, 2, 3]
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("ladder: no progress bar") and "pip install tqdm" in line


def test_progress_with_tqdm_draws_a_bar_on_stdout(capsys):
    assert list(display.progress(range(2), desc="sweep", unit="size")) == [0, 1]
    captured = capsys.readouterr()
    assert "sweep" in captured.out and "2/2" in captured.out and captured.err == ""


def test_a_table_lets_long_names_wrap_at_underscores_and_slashes_and_never_breaks_numbers():
    out = display.table([{"rung": "unrolled_bf16_batch32", "FLOP/byte": 1234567.0}], caption="c")
    assert "<td>unrolled_<wbr>bf16_<wbr>batch32</td>" in out.html_text and "<th>FLOP/<wbr>byte</th>" in out.html_text
    assert "<td>1.235e+06</td>" in out.html_text
    assert "unrolled_bf16_batch32" in out.plain and "<wbr>" not in out.plain
