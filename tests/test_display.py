"""Tests of dpcourse.display: escaped HTML tables, banners and charts."""

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dpcourse import display  # noqa: E402
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
