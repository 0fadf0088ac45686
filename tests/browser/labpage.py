"""Driving JupyterLab as a learner does, and reading what it shows.

Actions go through the user interface (the file browser, the Run menu, the
widgets' sliders and buttons). To tell what happened, the tests read the
notebook's model (execution counts, outputs, error names) through
``window.jupyterapp``, which the test server exposes
(``--LabApp.expose_app_in_browser``), and the page's text.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from playwright.sync_api import Page

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TRACEBACK = "Traceback (most recent call last)"

# The notebook panel showing `path`, looked up among the open documents.
_PANEL = """
const findPanel = (path) => {
  for (const w of window.jupyterapp.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.content.model) return w;
  }
  return null;
};
"""

_STATE = (
    "(path) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  if (!panel) return null;
  if (!panel.hasClass('jp-NotebookPanel')) return {isNotebook: false, kind: panel.content.node.className};
  const session = panel.sessionContext.session;
  const kernel = session && session.kernel;
  const cells = panel.content.model.cells;
  let total = 0, counted = 0, errors = 0;
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    total++;
    if (c.executionCount) counted++;
    for (const o of c.outputs.toJSON()) if (o.output_type === 'error') errors++;
  }
  const running = Array.from(panel.node.querySelectorAll('.jp-InputPrompt'))
    .filter((e) => e.textContent.includes('*')).length;
  return {status: kernel ? kernel.status : 'none', total, counted, errors, running,
          isNotebook: panel.hasClass('jp-NotebookPanel'), cells: cells.length};
}"""
)

_CELLS = (
    "(path) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  const cells = panel.content.model.cells;
  const text = (v) => (Array.isArray(v) ? v.join('') : (v || ''));
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    const texts = [], errors = [], stderr = [];
    for (const o of c.outputs.toJSON()) {
      if (o.output_type === 'error') {
        errors.push({ename: o.ename, evalue: o.evalue, traceback: (o.traceback || []).join('\\n')});
      } else if (o.output_type === 'stream') {
        texts.push(text(o.text));
        if (o.name === 'stderr') stderr.push(text(o.text));
      } else if (o.data) {
        texts.push(text(o.data['text/plain']) + '\\n' + text(o.data['text/html']));
      }
    }
    out.push({index: i, count: c.executionCount, source: c.sharedModel.getSource(), texts, errors, stderr});
  }
  return out;
}"""
)

_SCROLL = (
    "([path, index]) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  panel.content.activeCellIndex = index;
  panel.content.scrollToItem(index, 'start');
  return true;
}"""
)

# The cell's output (an error, a table) rather than the top of its code.
_SCROLL_TO_OUTPUT = (
    "([path, index]) => {"
    + _PANEL
    + """
  const cell = findPanel(path).content.widgets[index];
  const output = cell && cell.node.querySelector('.jp-OutputArea-output');
  if (output) output.scrollIntoView({block: 'start'});
  return Boolean(output);
}"""
)

_SCROLL_TO_TEXT = (
    "([path, text]) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  for (const el of panel.node.querySelectorAll('.jp-OutputArea-output')) {
    if (el.textContent.includes(text)) { el.scrollIntoView({block: 'start'}); return true; }
  }
  return false;
}"""
)

_EXECUTE = (
    "async ([path, code]) => {"
    + _PANEL
    + """
  const kernel = findPanel(path).sessionContext.session.kernel;
  const future = kernel.requestExecute({code, silent: false, store_history: false});
  let out = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') out += msg.content.text;
    if (msg.header.msg_type === 'error') out += msg.content.ename + ': ' + msg.content.evalue;
  };
  await future.done;
  return out;
}"""
)


@dataclass
class CodeCell:
    """One code cell after the run: position (0-based among all cells), count, outputs."""

    index: int
    count: int | None
    source: str
    texts: list[str]
    errors: list[dict]
    stderr: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How a learner finds the cell: its number in the status bar and its first line."""
        first = next((line for line in self.source.splitlines() if line.strip()), "")
        return f"cell {self.index + 1} `{first[:70]}`"


@dataclass
class LessonRun:
    """What one lesson showed in the browser, and every problem found."""

    lesson: str
    cells: list[CodeCell] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem_cell: int | None = None
    controls_cell: int | None = None
    screenshot: str | None = None
    seconds: float = 0.0
    overflow: list[dict] | None = None  # cells that scroll sideways (horizontal_overflow), None: not measured
    notes: list[str] = field(default_factory=list)

    def problem(self, text: str, cell: CodeCell | None = None) -> None:
        self.problems.append(f"{cell.label}: {text}" if cell else text)
        if cell is not None and self.problem_cell is None:
            self.problem_cell = cell.index

    def report(self) -> str:
        lines = [f"Lesson {self.lesson} failed in the browser:"]
        lines += [f"  - {p}" for p in self.problems]
        if self.screenshot:
            lines.append(f"  screenshot: {self.screenshot}")
        return "\n".join(lines)


def lab_url(base: str, token: str, path: str | None = None, workspace: str = "default") -> str:
    """The address a learner opens: the lab (a workspace of its own), optionally with a file."""
    tree = f"/tree/{path}" if path else ""
    return f"{base}/lab/workspaces/{workspace}{tree}?token={token}"


def wait_for_lab(page: Page, timeout_s: float = 90) -> None:
    """Wait until the lab has loaded and the file browser lists files."""
    page.wait_for_selector(".jp-DirListing-item", timeout=timeout_s * 1000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=timeout_s * 1000)


def state(page: Page, path: str) -> dict | None:
    """Kernel status and cell counts of the open notebook ``path`` (None: not open as a notebook)."""
    return page.evaluate(_STATE, path)


def wait_for_kernel(page: Page, path: str, timeout_s: float = 120) -> None:
    """Wait until ``path`` is open as a notebook and its kernel is idle.

    Raises:
        TimeoutError: it did not happen in time (the last state is in the message).
    """
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = state(page, path)
        if last and not last["isNotebook"]:
            raise AssertionError(f"{path} opened, but not as a notebook ({last.get('kind')})")
        if last and last["status"] == "idle":
            return
        time.sleep(0.5)
    raise TimeoutError(f"{path}: no idle kernel after {timeout_s:.0f} s (last state {last})")


# Code cells whose model has outputs that the page does not show yet (JupyterLab renders a
# long notebook's cells lazily, so right after opening, cells further down may be empty).
_UNRENDERED = (
    "(path) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  if (!panel) return -1;
  let missing = 0;
  for (const cell of panel.content.widgets) {
    if (cell.model.type !== 'code' || cell.model.outputs.length === 0) continue;
    if (cell.node.querySelectorAll('.jp-OutputArea-output').length === 0) missing++;
  }
  return missing;
}"""
)


_SCROLL_TO_UNRENDERED = (
    "(path) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  const cells = panel.content.widgets;
  for (let i = 0; i < cells.length; i++) {
    const cell = cells[i];
    if (cell.model.type !== 'code' || cell.model.outputs.length === 0) continue;
    if (cell.node.querySelectorAll('.jp-OutputArea-output').length === 0) {
      panel.content.activeCellIndex = i;
      panel.content.scrollToItem(i, 'center');
      return i;
    }
  }
  return -1;
}"""
)


def wait_rendered(page: Page, path: str, timeout_s: float = 60) -> None:
    """Wait until every code cell with outputs shows them, scrolling through the notebook to get there.

    The key-output and width checks read the page, so they must wait for
    cells that JupyterLab has not drawn yet.

    Raises:
        TimeoutError: cells were still not drawn after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    missing = page.evaluate(_UNRENDERED, path)
    while missing != 0 and time.monotonic() < deadline - timeout_s / 2:  # drawn while idle, top down
        time.sleep(0.5)
        missing = page.evaluate(_UNRENDERED, path)
    while missing != 0 and time.monotonic() < deadline:  # else scrolling to a cell draws it
        page.evaluate(_SCROLL_TO_UNRENDERED, path)
        page.wait_for_timeout(300)
        missing = page.evaluate(_UNRENDERED, path)
    if missing != 0:
        raise TimeoutError(f"{path}: {missing} code cell(s) with outputs still not drawn after {timeout_s:.0f} s")
    # Outputs are rendered asynchronously into their areas: wait until the page's text stops growing.
    size = len(notebook_text(page, path))
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        now = len(notebook_text(page, path))
        if now == size:
            return
        size = now


def run_all_from_menu(page: Page) -> None:
    """Run > Run All Cells, clicked in the menu bar."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def wait_until_run(page: Page, path: str, timeout_s: float) -> dict:
    """Wait until the kernel is idle and every code cell has run, or one raised.

    Run All stops at the first error, so a raised error also ends the wait.
    The kernel must be seen idle twice, a second apart, with nothing queued.

    Returns:
        the last state (see :func:`state`); ``timed_out`` is True when
        ``timeout_s`` passed first.
    """
    deadline = time.monotonic() + timeout_s
    idle_seen = 0
    last: dict = {}
    while time.monotonic() < deadline:
        last = state(page, path) or {}
        finished = last.get("counted") == last.get("total") or last.get("errors", 0) > 0
        if last.get("status") == "idle" and finished and not last.get("running"):
            idle_seen += 1
            if idle_seen >= 2:
                return {**last, "timed_out": False}
        else:
            idle_seen = 0
        if last.get("status") in ("dead", "unknown"):
            return {**last, "timed_out": False}
        time.sleep(1.0)
    return {**last, "timed_out": True}


def code_cells(page: Page, path: str) -> list[CodeCell]:
    """Every code cell of the open notebook with its count and outputs."""
    return [CodeCell(**cell) for cell in page.evaluate(_CELLS, path)]


def notebook_text(page: Page, path: str) -> str:
    """The text the notebook shows (every cell, rendered)."""
    return page.evaluate("(path) => {" + _PANEL + "return findPanel(path).node.textContent; }", path)


def scroll_to_cell(page: Page, path: str, index: int) -> None:
    """Make cell ``index`` (0-based among all cells) the active one and scroll its output into view."""
    page.evaluate(_SCROLL, [path, index])
    page.wait_for_timeout(500)
    for _ in range(3):  # see scroll_to_text
        page.evaluate(_SCROLL_TO_OUTPUT, [path, index])
        page.wait_for_timeout(400)


def scroll_to_text(page: Page, path: str, text: str) -> bool:
    """Scroll the first output showing ``text`` to the top of the notebook; False if none shows it."""
    # Cells off screen are laid out when they come into view (content-visibility),
    # which moves the target: scroll again until it stays.
    found = False
    for _ in range(3):
        found = page.evaluate(_SCROLL_TO_TEXT, [path, text])
        page.wait_for_timeout(400)
    return found


def kernel_execute(page: Page, path: str, code: str) -> str:
    """Run ``code`` in the notebook's kernel without adding a cell; returns what it printed."""
    return page.evaluate(_EXECUTE, [path, code])


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def check_cells(run: LessonRun, cells: list[CodeCell]) -> None:
    """Record every error output, traceback text and cell that did not run."""
    for cell in cells:
        for err in cell.errors:
            detail = strip_ansi(err.get("traceback") or "").strip().splitlines()
            where = f" [{detail[-1][:300]}]" if detail and detail[-1].strip() else ""
            run.problem(f"raised {err['ename']}: {strip_ansi(err['evalue'])[:500]}{where}", cell)
        for text in cell.texts:
            if TRACEBACK in strip_ansi(text):
                tail = strip_ansi(text).strip().splitlines()[-1][:300]
                run.problem(f"printed a traceback, ending: {tail}", cell)
    for cell in cells:
        for text in cell.stderr:  # warnings are allowed, but shown in a red box: worth a look
            first = next((line for line in strip_ansi(text).splitlines() if line.strip()), "")
            run.notes.append(f"stderr in {cell.label}: {first[:120]}")
    if not any(cell.errors for cell in cells):
        for cell in cells:
            if not cell.count:
                run.problem("did not run (no execution count)", cell)


# ---- widgets -----------------------------------------------------------


def widget_labels(page: Page) -> list[dict]:
    """Every widget description label: its text and whether it is cut off."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('.jp-NotebookPanel .widget-label'))
          .filter((e) => e.textContent.trim())
          .map((e) => ({text: e.textContent, cut: e.scrollWidth > e.clientWidth + 1,
                        shown: e.clientWidth, needed: e.scrollWidth}))"""
    )


def output_widget_text(page: Page) -> str:
    """The text of every ipywidgets Output area in the open notebooks."""
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('.jp-NotebookPanel .widget-output'))"
        ".map((e) => e.innerText).join('\\n')"
    )


def wait_kernel_busy_then_idle(page: Page, path: str, timeout_s: float) -> bool:
    """After a click that runs code: wait for busy (briefly), then for idle twice in a row."""
    deadline = time.monotonic() + timeout_s
    seen_busy = False
    while time.monotonic() < deadline and not seen_busy:
        seen_busy = (state(page, path) or {}).get("status") == "busy"
        if time.monotonic() > deadline - timeout_s + 5:
            break  # a very fast callback may finish before the first look
        time.sleep(0.1)
    idle = 0
    while time.monotonic() < deadline:
        idle = idle + 1 if (state(page, path) or {}).get("status") == "idle" else 0
        if idle >= 2:
            return True
        time.sleep(0.5)
    return False


# ---- the file browser, editing and saving, the screen's width ------------


def listed_names(page: Page) -> list[str]:
    """The names the file browser lists in the folder it shows."""
    page.wait_for_selector(".jp-DirListing-item")
    return [t.strip() for t in page.locator(".jp-DirListing-item .jp-DirListing-itemText").all_inner_texts()]


def cut_names(page: Page) -> list[dict]:
    """File browser names that do not fit their column (shown with an ellipsis)."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('.jp-DirListing-item .jp-DirListing-itemText'))
          .map((e) => [e, e.querySelector('span') || e])
          .filter(([e, s]) => e.scrollWidth > e.clientWidth + 1 || s.scrollWidth > s.clientWidth + 1)
          .map(([e]) => ({name: e.textContent.trim(), shown: e.clientWidth, needed: e.scrollWidth}))"""
    )


def open_from_browser(page: Page, name: str, timeout_s: float = 120, path: str | None = None) -> None:
    """Double click ``name`` in the file browser; wait until its notebook (at ``path``, default ``name``) is idle."""
    page.locator(".jp-DirListing-item", has=page.locator(".jp-DirListing-itemText", has_text=name)).first.dblclick()
    wait_for_kernel(page, path or name, timeout_s)


def open_folder(page: Page, name: str) -> None:
    """Double click a folder in the file browser (``..`` not included)."""
    page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    page.wait_for_function(
        "(name) => document.querySelector('.jp-FileBrowser-crumbs')?.textContent.includes(name)", arg=name
    )


_MARK_CELL = (
    "([path, index]) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  panel.content.activeCellIndex = index;
  panel.content.scrollToItem(index, 'center');
  document.querySelectorAll('[data-test-cell]').forEach((e) => e.removeAttribute('data-test-cell'));
  panel.content.widgets[index].node.setAttribute('data-test-cell', 'target');
  return true;
}"""
)


def type_into_cell(page: Page, path: str, index: int, text: str, replace: bool = False) -> None:
    """Click into cell ``index``'s editor and type ``text`` at its start (or instead of its source)."""
    page.evaluate(_MARK_CELL, [path, index])
    page.wait_for_timeout(500)
    editor = page.locator("[data-test-cell=target] .cm-content")
    editor.click()
    page.keyboard.press("Control+a" if replace else "Control+Home")
    if replace:
        page.keyboard.press("Delete")
    page.keyboard.insert_text(text)
    page.keyboard.press("Escape")  # command mode, as a learner leaving the cell


def save(page: Page, path: str) -> None:
    """Ctrl+S, then wait until the document is no longer marked dirty."""
    page.keyboard.press("Control+s")
    page.wait_for_function(
        "(path) => {" + _PANEL + "const p = findPanel(path); return p && !p.context.model.dirty; }", arg=path
    )


def close_all(page: Page, discard: bool = False) -> None:
    """Close every tab (File > Close All Tabs).

    With ``discard``, a "Save your work" question is answered Discard (a
    notebook only opened is marked modified once its kernel adds its
    language to the metadata); without, any question is a failure.
    """
    page.evaluate("() => { window.jupyterapp.commands.execute('application:close-all'); }")
    page.wait_for_timeout(800)
    dialog = page.locator(".jp-Dialog")
    while dialog.count():
        if not discard:
            raise AssertionError(f"closing asked: {dialog.first.inner_text()[:300]}")
        dialog.get_by_role("button", name="Discard").click()
        page.wait_for_timeout(500)


_OVERFLOW = (
    "async (path) => {"
    + _PANEL
    + """
  const panel = findPanel(path);
  const nb = panel.content;
  const found = [];
  const scrolls = (el) => {
    if (el.scrollWidth <= el.clientWidth + 1 || el.clientWidth === 0) return false;
    const x = getComputedStyle(el).overflowX;
    return x === 'auto' || x === 'scroll' || x === 'hidden' || x === 'clip';
  };
  for (let i = 0; i < nb.widgets.length; i++) {
    const cell = nb.widgets[i];
    await nb.scrollToItem(i, 'start');
    await new Promise((r) => setTimeout(r, 60));
    const src = cell.model.sharedModel.getSource();
    const longest = Math.max(0, ...src.split('\\n').map((l) => l.length));
    const first = (src.split('\\n').find((l) => l.trim()) || '').slice(0, 60);
    for (const el of cell.node.querySelectorAll('.jp-InputArea *, .jp-OutputArea-output, .jp-OutputArea-output *')) {
      if (!scrolls(el)) continue;
      const where = el.closest('.jp-OutputArea') ? 'output' : 'input';
      found.push({cell: i + 1, type: cell.model.type, where, shown: el.clientWidth, needed: el.scrollWidth,
                  longest, first});
      break;
    }
  }
  const outer = panel.node.querySelector('.jp-WindowedPanel-outer');
  if (outer && outer.scrollWidth > outer.clientWidth + 1) {
    found.push({cell: 0, where: 'notebook', shown: outer.clientWidth, needed: outer.scrollWidth});
  }
  return found;
}"""
)


def show_file_browser(page: Page) -> None:
    """Open the file browser in the left sidebar (as the lab starts), if it is closed."""
    if page.locator(".jp-FileBrowser:visible").count() == 0:
        page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
        page.wait_for_selector(".jp-FileBrowser", state="visible")


def horizontal_overflow(page: Page, path: str) -> list[dict]:
    """Each cell whose input or output area scrolls (or cuts) sideways: cell number (1-based), widths.

    Every cell is scrolled into view first: cells off screen are not laid out.
    """
    return page.evaluate(_OVERFLOW, path)


def describe_overflow(found: list[dict]) -> str:
    """One line per cell that needs sideways scrolling, for a failure message."""
    return "\n".join(
        f"  cell {f['cell']} ({f.get('type', '')} {f['where']}): {f['needed']} px needed, {f['shown']} px shown; "
        f"longest line {f.get('longest', '?')} chars; `{f.get('first', '')}`"
        for f in found
    )


def all_sources(page: Page, path: str) -> list[str]:
    """The source of every cell (markdown too) of the open notebook, from its model.

    Unlike :func:`notebook_text`, this does not depend on which cells the
    notebook has laid out (cells far off screen are not rendered).
    """
    return page.evaluate(
        "(path) => {"
        + _PANEL
        + """
  const cells = findPanel(path).content.model.cells;
  return Array.from({length: cells.length}, (_, i) => cells.get(i).sharedModel.getSource());
}""",
        path,
    )
