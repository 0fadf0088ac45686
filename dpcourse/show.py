"""Tables, banners, charts, optional widgets and source listings for the notebooks.

Every notebook uses these; all text put into HTML is escaped. Functions
return objects that Jupyter renders (``IPython.display.HTML``) and that
print as plain text in a terminal. Every chart is shown through
:func:`show_figure`, as a PNG, so that it appears in the executed notebook
whatever matplotlib's backend (``MPLBACKEND=Agg`` included).
"""

from __future__ import annotations

import html
import inspect
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class Html:
    """HTML for Jupyter with a plain-text fallback for terminals and logs."""

    def __init__(self, html_text: str, plain: str):
        self.html_text = html_text
        self.plain = plain

    def _repr_html_(self) -> str:
        return self.html_text

    def __repr__(self) -> str:
        return self.plain

    __str__ = __repr__


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
        return f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if value is None:
        return "n/a"
    return str(value)


_NAME_BREAK = re.compile(r"(?<=[A-Za-z0-9][_/])(?=[A-Za-z0-9])")  # after the _ and / of a long name


def _breakable(text: str) -> str:
    """``text`` escaped for HTML, a word of 8 or more characters able to wrap after its ``_`` and ``/``."""
    words = re.split(r"(\s+)", text)
    return "".join(
        "<wbr>".join(map(html.escape, _NAME_BREAK.split(w))) if len(w) >= 8 else html.escape(w) for w in words
    )


def table(rows: Sequence[Mapping[str, Any]], caption: str = "", columns: Sequence[str] | None = None) -> Html:
    """An HTML table of ``rows`` (dicts); columns default to the first row's keys.

    Numbers are formatted with thousands separators; None shows as ``n/a``.
    """
    columns = list(columns or (rows[0].keys() if rows else []))
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    head = "".join(f"<th>{_breakable(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_breakable(v)}</td>" for v in row) + "</tr>" for row in cells)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    html_text = f'<table class="dpcourse">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    widths = [max([len(str(c))] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [caption] if caption else []
    lines.append("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)
    return Html(html_text, "\n".join(lines))


def key_values(pairs: Mapping[str, Any], caption: str = "") -> Html:
    """A two-column table (name, value)."""
    return table([{"": k, "value": v} for k, v in pairs.items()], caption, columns=["", "value"])


def banner(text: str, level: str = "note", details: str = "") -> Html:
    """A coloured box: ``level`` is "note", "warning" or "error".

    ``details`` (optional) go in a collapsed ``<details>`` element under the
    one-line text, one click away in a notebook; the plain form prints them
    on the following lines.
    """
    colours = {"note": "#e8f1fb", "warning": "#fff4d6", "error": "#fde2e1"}
    bg = colours.get(level, colours["note"])
    style = f"background:{bg};padding:8px 12px;border-left:4px solid #888;margin:6px 0"
    more = ""
    if details:
        more = (
            '<details><summary style="cursor:pointer">details</summary>'
            f'<pre style="white-space:pre-wrap;margin:4px 0">{html.escape(details)}</pre></details>'
        )
    shown = Html(
        f'<div style="{style}"><b>{html.escape(level.upper())}</b>: {html.escape(text)}{more}</div>',
        f"[{level.upper()}] {text}" + (f"\n  {details}" if details else ""),
    )
    shown.parts = [(level, text, details)]  # what banner_group puts together
    return shown


_LEVELS = ("note", "warning", "error")


def banner_group(banners: list[Html]) -> Html | None:
    """The banners of :func:`banner` as one box: one line each, coloured by the most severe level.

    A lesson opens with one box however many things its set-up has to say
    (simulated devices, synthetic data, a setting JAX ignored); each line keeps
    its own label and its details, one click away. Returns None for no banners;
    a single banner comes back as it is.
    """
    parts = [part for b in banners for part in getattr(b, "parts", [("note", str(b), "")])]
    if not parts:
        return None
    if len(banners) == 1:
        return banners[0]
    worst = max((level for level, _, _ in parts), key=lambda lv: _LEVELS.index(lv) if lv in _LEVELS else 0)
    colours = {"note": "#e8f1fb", "warning": "#fff4d6", "error": "#fde2e1"}
    style = f"background:{colours.get(worst, colours['note'])};padding:8px 12px;border-left:4px solid #888;margin:6px 0"
    lines, plain = [], []
    for level, text, details in parts:
        more = ""
        if details:
            more = (
                '<details style="display:inline"><summary style="cursor:pointer;display:inline"> (details)</summary>'
                f'<pre style="white-space:pre-wrap;margin:4px 0">{html.escape(details)}</pre></details>'
            )
        lines.append(f"<div><b>{html.escape(level.upper())}</b>: {html.escape(text)}{more}</div>")
        plain.append(f"[{level.upper()}] {text}" + (f"\n  {details}" if details else ""))
    group = Html(f'<div style="{style}">{"".join(lines)}</div>', "\n".join(plain))
    group.parts = parts
    return group


def data_banner(source: str, note: str) -> Html:
    """The one-line banner every notebook shows about its data source; why, one click away."""
    if source == "synthetic":
        return banner(
            "SYNTHETIC DATA with Fashion-MNIST's shapes, not the real images: loss and accuracy are not "
            "comparable with published results.",
            "warning",
            details=note,
        )
    return banner(f"Data: {note}", "note")


def show_source(obj) -> Html:
    """The source code of a function (how the package's helper is written)."""
    src = inspect.getsource(obj)
    return Html(f"<pre><code>{html.escape(src)}</code></pre>", src)


_SHOWN = "_dpcourse_shown"


def show_figure(fig) -> None:
    """Show a matplotlib figure in the notebook as a PNG, once, whatever the backend.

    With the inline backend Jupyter shows open figures at the end of a cell;
    with a non-interactive one (``MPLBACKEND=Agg``, set by some runners) it
    shows nothing, and an executed notebook loses its charts. This renders
    the figure to PNG, displays it with ``IPython.display``, and closes it
    in pyplot, so the inline backend does not show it a second time (the
    figure object stays usable, e.g. for ``savefig``). A figure already
    shown is not shown again. Outside IPython nothing is displayed.
    """
    import io

    import matplotlib.pyplot as plt

    if not getattr(fig, _SHOWN, False):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        setattr(fig, _SHOWN, True)
        try:
            import base64

            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is not None:
                png = base64.b64encode(buffer.getvalue()).decode("ascii")
                display({"image/png": png, "text/plain": figure_text(fig)}, raw=True)
        except ImportError:  # pragma: no cover - IPython is a course requirement
            pass
    plt.close(fig)


def figure_text(fig) -> str:
    """A sentence per chart of ``fig`` from its own data: title, axes labels and ranges, named series.

    The text a figure is shown with beside its PNG (the output's
    ``text/plain``): what a screen reader reads, and the site's ``alt``.
    """
    parts = []
    for ax in fig.get_axes():
        title = ax.get_title() or (fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else "") or "Chart"
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        text = f"{title}: {ax.get_xlabel() or 'x'} from {x0:.3g} to {x1:.3g}, {ax.get_ylabel() or 'y'} from {y0:.3g} to {y1:.3g}"
        series = [h.get_label() for h in ax.get_legend_handles_labels()[0] if not h.get_label().startswith("_")]
        parts.append(text + (f"; {', '.join(series)}" if series else "") + ".")
    return " ".join(parts) or "A chart without axes."


def describe_figures() -> bool:
    """Make every matplotlib figure this IPython shows carry :func:`figure_text` as its ``text/plain``.

    The inline backend shows a figure as a PNG with ``<Figure size ...>``
    beside it; with this, the text says what the chart holds (a screen
    reader's text, the site's ``alt``). Called by
    :func:`dpcourse.lesson.start_lesson`. Returns False outside IPython.
    """
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - both are course requirements
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    shell.display_formatter.formatters["text/plain"].for_type(Figure, lambda fig, p, cycle: p.text(figure_text(fig)))
    return True


def figure(fig, name: str):
    """Save a chart as ``<notebook>_<name>.png`` beside the results (when recording) and show it.

    Returns:
        The PNG's path, or None when recording is off (see
        :func:`dpcourse.record.save_figure`).
    """
    from dpcourse import record as results

    path = results.save_figure(fig, name)
    show_figure(fig)
    return path


def optional_widgets():
    """``ipywidgets``, or None with a one-line note when it cannot be imported.

    Interactive controls are extras: a lesson without them still runs.
    """
    try:
        import ipywidgets
    except ImportError as err:
        note = banner(
            f"Interactive controls skipped: ipywidgets cannot be imported ({err}). "
            "Install it (pip install ipywidgets) for the controls; the rest of the lesson runs.",
            "note",
        )
        try:
            from IPython.display import display

            display(note)
        except ImportError:  # pragma: no cover
            print(note)
        return None
    return ipywidgets


def progress(items, desc: str, unit: str = "it"):
    """A text progress bar (tqdm, on stdout) over ``items``; without tqdm, ``items`` and one line on what it adds.

    tqdm is optional: a lesson runs without it. The bar goes to stdout because
    JupyterLab shows stderr in a red box, which reads as an error.
    """
    import sys

    try:
        from tqdm import tqdm
    except ImportError:
        print(f"{desc}: no progress bar (the optional tqdm package draws one: pip install tqdm).")
        return items
    return tqdm(items, desc=desc, unit=unit, file=sys.stdout)


def bar_chart(
    labels: Sequence[str], values: Sequence[float], ylabel: str, title: str, note: str = "", show: bool = True
):
    """A matplotlib bar chart, shown at once (:func:`show_figure`); returns the figure.

    The caller may still save it (``results.save_figure``). ``note`` is
    printed under the axis (e.g. that simulated devices add no compute);
    ``show=False`` leaves showing to the caller.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    bars = ax.bar(list(labels), list(values), color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(values)])
    ax.bar_label(bars, labels=[_fmt(float(v)) for v in values], padding=2, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if note:
        fig.text(0.01, -0.04, note, fontsize=8, ha="left", va="top")
    fig.tight_layout()
    if show:
        show_figure(fig)
    return fig


def records_table(results: Iterable[Any], data_source: str) -> Html:
    """A results table from :class:`dpcourse.bench.BenchResult` objects.

    Every results table names its data source (real or synthetic).
    """
    rows = []
    for r in results:
        row = {
            "run": r.label,
            "devices": r.n_devices,
            "global batch": r.global_batch,
            "compile s": r.compile_s,
            "compile": getattr(r, "compile_kind", "") or "n/a",  # cold or warm: see bench.compile_step
            "ms/step": r.ms_per_step,
            "examples/s": r.examples_per_s,
            "final loss": r.final_loss,
            "final accuracy": r.final_accuracy,
            "data": data_source,
        }
        rows.append(row)
    return table(rows, caption=f"Benchmark (median over repeats; data: {data_source})")


def _is_traced(array) -> bool:
    import jax

    return isinstance(array, jax.core.Tracer)


def _print_blocks(array, name: str) -> bool:
    """Inside ``shard_map``: print, as each device runs, its index along every mesh axis and its block's shape.

    Returns:
        True when it set up the print (a ``shard_map`` body), False for a
        value traced by ``jit`` alone (no per-device block exists there).
    """
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(getattr(mesh, "manual_axes", ()) or ())
    if not axes:
        return False
    where = ", ".join(f"{axis}={{{axis}}}" for axis in axes)
    shape = tuple(array.shape)
    # The shape is static (the same on every device); the index is each device's own.
    jax.debug.print(
        f"{name}: the device at {where} holds a local block of shape {shape} {array.dtype}",
        **{axis: jax.lax.axis_index(axis) for axis in axes},
    )
    return True


TRACED_BY_JIT = (
    "{name} is traced by jit here (an abstract value, no data yet): which device holds what is decided "
    "when the function is compiled, so there is nothing per device to show inside it. Show the result "
    "outside jit (show.sharding(result)), or inside shard_map, where each device's block is known."
)


def shard_table(array, name: str = "array") -> Html:
    """Per-device shard shapes of a ``jax.Array`` of any rank.

    ``jax.debug.visualize_array_sharding`` draws only rank-1 and rank-2
    arrays; this table covers the rest (e.g. stacked batches
    ``[n_batches, global_batch, 784]``). Taught in notebook 04.

    Inside a ``shard_map`` body the value is one device's block, not a
    global array: each device then prints its index along the mesh axes and
    its block's shape as it runs (``jax.debug.print``), and the returned
    note says so. Inside ``jit`` alone the note says why there is nothing
    per device to show.
    """
    if _is_traced(array):
        if _print_blocks(array, name):
            text = f"{name}: inside shard_map each device prints its own block (its index along the axis, its shape) as it runs."
        else:
            text = TRACED_BY_JIT.format(name=name)
        return Html(f"<p>{html.escape(text)}</p>", text)
    rows = []
    for shard in sorted(array.addressable_shards, key=lambda s: s.device.id):
        index = ", ".join(
            ":" if (s.start is None and s.stop is None) else f"{s.start or 0}:{s.stop}" for s in shard.index
        )
        rows.append(
            {
                "device": f"{shard.device.platform}:{shard.device.id}",
                "shard shape": str(tuple(shard.data.shape)),
                "slice of the global array": f"[{index}]",
            }
        )
    caption = f"{name}: global shape {tuple(array.shape)}, sharding {array.sharding.spec if hasattr(array.sharding, 'spec') else array.sharding}"
    return table(rows, caption)


RICH_MISSING = (
    "The sharding picture needs the rich package (pip install rich, or -r requirements.txt); "
    "here is the same placement as a table."
)


def _display(obj) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(obj)
            return
    except ImportError:  # pragma: no cover - IPython is a course requirement
        pass
    print(obj)


def sharding(array, name: str = "array") -> None:
    """Show where each part of ``array`` lives: the picture where it can be drawn, else a table; prints.

    * a concrete rank-1 or rank-2 ``jax.Array`` with ``rich`` installed:
      ``jax.debug.visualize_array_sharding``'s picture;
    * another rank, or without ``rich`` (which JAX needs for the picture):
      :func:`shard_table` (per-device shard shapes), after one line saying
      what to install for the picture;
    * inside a ``shard_map`` body, where ``visualize_array_sharding`` draws
      one box over all devices that looks replicated: each device prints its
      index along the mesh axes and its local block's shape as it runs;
    * inside ``jit`` alone: one sentence on why there is nothing per device.
    """
    import importlib.util

    if _is_traced(array):
        if not _print_blocks(array, name):
            print(TRACED_BY_JIT.format(name=name))
        return
    if array.ndim in (1, 2) and importlib.util.find_spec("rich") is not None:
        import jax

        jax.debug.visualize_array_sharding(array)
        return
    if array.ndim in (1, 2):
        print(RICH_MISSING)
    _display(shard_table(array, name))
