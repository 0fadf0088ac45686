"""The built site in Chromium, over file:// and over http://127.0.0.1 (a free port): offline, whole, readable at 1280 px."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
from axe import missing as axe_missing
from axe import severe_violations

# Images: load every one (lazy ones too) and report its size; over http also
# whether it has more than one colour (a canvas of a file:// image is tainted).
_IMAGES_JS = """async (pixels) => {
  const out = [];
  for (const img of Array.from(document.images)) {
    img.loading = 'eager';
    if (!img.complete) await new Promise(r => { img.onload = r; img.onerror = r; setTimeout(r, 10000); });
    let colours = null;
    if (pixels && img.naturalWidth > 0) {
      const c = document.createElement('canvas'); c.width = 64; c.height = 64;
      const g = c.getContext('2d'); g.drawImage(img, 0, 0, 64, 64);
      const d = g.getImageData(0, 0, 64, 64).data; const seen = new Set();
      for (let i = 0; i < d.length && seen.size < 3; i += 4) seen.add(d.slice(i, i + 4).join(','));
      colours = seen.size;
    }
    out.push({src: (img.currentSrc || img.src).slice(0, 120), w: img.naturalWidth, h: img.naturalHeight, colours});
  }
  return out;
}"""


# Output and code blocks wider than their box (a line that neither wraps nor fits), first 80 characters each.
_WIDE_OUTPUTS_JS = """() => Array.from(document.querySelectorAll('.cell_output pre, .cell_input pre, .bd-article div.highlight pre'))
  .filter(b => b.scrollWidth > b.clientWidth + 1)
  .map(b => `${b.scrollWidth} px in ${b.clientWidth} px: ${b.textContent.trim().slice(0, 80)}`)"""
# Tables whose columns do not all show: the first column must stay put (position: sticky) while the box scrolls.
_WIDE_TABLES_JS = """() => Array.from(document.querySelectorAll('.cell_output table, .bd-article table'))
  .filter(t => t.scrollWidth > t.clientWidth + 1)
  .filter(t => { const c = t.querySelector('tr > :first-child');
                 return !c || getComputedStyle(c).position !== 'sticky'; })
  .map(t => `${t.scrollWidth} px in ${t.clientWidth} px: ${(t.querySelector('caption') || t).textContent.trim().slice(0, 80)}`)"""
# A lesson's own tables (cell outputs) fit the column whole: every column shows without scrolling.
_CUT_TABLES_JS = """() => Array.from(document.querySelectorAll('.cell_output table'))
  .filter(t => t.scrollWidth > t.clientWidth + 1)
  .map(t => `${t.scrollWidth} px in ${t.clientWidth} px: ${(t.querySelector('caption') || t).textContent.trim().slice(0, 80)}`)"""
_NO_ALT_JS = """() => Array.from(document.querySelectorAll('.bd-article img'))
  .filter(i => !(i.getAttribute('alt') || '').trim()).map(i => (i.currentSrc || i.src).slice(0, 120))"""


# The build machine's own folders (coursetools.streams.machine_folders names them in words on the pages).
_MACHINE_FOLDERS = (str(Path(__file__).resolve().parents[2]) + "/", tempfile.gettempdir().rstrip("/") + "/")


def pages(site_dir: Path) -> list[str]:
    """Every HTML page of the site, relative to its root (not the theme's own static files)."""
    found = [p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html")]
    return sorted(p for p in found if not p.startswith(("_static/", "_sources/", "_downloads/")))


def _foreign(url: str, page_url: str) -> bool:
    """Whether ``url`` is on another host than the page ``page_url`` (a file:// page: anything but a file)."""
    parsed, own = urlparse(url), urlparse(page_url)
    if parsed.scheme in ("data", "blob", "about"):
        return False
    if own.scheme == "file":
        return parsed.scheme != "file"
    return parsed.netloc != own.netloc


def _url(mode: str, site_dir: Path, http_root: str | None, rel: str) -> str:
    return (site_dir / rel).as_uri() if mode == "file" else http_root + rel


def _check_page(page, url: str, mode: str) -> list[str]:
    page.problems.clear()
    page.requests.clear()
    page.goto(url, wait_until="load")
    page.wait_for_timeout(300)  # scripts that run after load (search index, theme)
    problems = list(page.problems)
    problems += [f"request to another host: {u}" for u in page.requests if _foreign(u, url)]
    for img in page.evaluate(_IMAGES_JS, mode == "http"):
        if img["w"] == 0 or img["h"] == 0:
            problems.append(f"image without pixels: {img['src']}")
        elif img["colours"] is not None and img["colours"] < 2:
            problems.append(f"image of one colour: {img['src']}")
    wide = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    if wide[0] > wide[1] + 1:
        problems.append(f"the page scrolls sideways at 1280 px: {wide[0]} px wide in a {wide[1]} px window")
    problems += [f"an output or a code block scrolls sideways: {b}" for b in page.evaluate(_WIDE_OUTPUTS_JS)]
    problems += [f"a lesson's table loses columns: {t}" for t in page.evaluate(_CUT_TABLES_JS)]
    problems += [f"a wide table scrolls without its first column fixed: {t}" for t in page.evaluate(_WIDE_TABLES_JS)]
    problems += [f"an image without alt text: {src}" for src in page.evaluate(_NO_ALT_JS)]
    text = page.evaluate("document.body.innerText")
    problems += [f"the build machine's folder {f} is published" for f in _MACHINE_FOLDERS if f in text]
    return problems


@pytest.mark.parametrize("mode", ["file", "http"])
def test_every_page_loads_offline_whole_and_fits(mode, page, site_dir, request):
    """Every page: no console or page error, no failed request, nothing from another host, images with pixels.

    Over HTTP each page, once loaded, also goes through axe-core (tools/site/package-lock.json): no serious
    or critical violation. Not over file://, where the browser refuses the requests axe-core makes for the
    page's style sheets (CORS), and their console errors could reach the next page's check.
    """
    http_root = request.getfixturevalue("http_root") if mode == "http" else None
    axe = mode == "http"
    reason = axe_missing() if axe else None
    if reason:
        pytest.fail(reason, pytrace=False)
    listed = pages(site_dir)
    assert any(p.startswith("lessons/") for p in listed), f"no lesson pages in {site_dir}"
    failures = {}
    for rel in listed:
        problems = _check_page(page, _url(mode, site_dir, http_root, rel), mode)
        if axe:
            problems += [f"accessibility: {v}" for v in severe_violations(page)]
        if problems:
            failures[rel] = problems
    assert not failures, "\n".join(f"{rel}: " + "; ".join(p) for rel, p in failures.items())


@pytest.mark.parametrize("mode", ["file", "http"])
def test_sweep_lesson_controls_render(mode, page, site_dir, request):
    """07's sliders and button render from the saved widget state with the site's own widget manager."""
    http_root = request.getfixturevalue("http_root") if mode == "http" else None
    sweep = [p for p in pages(site_dir) if p.startswith("lessons/07_")]
    assert sweep, f"no lesson 07 page in {site_dir / 'lessons'}"
    page.goto(_url(mode, site_dir, http_root, sweep[0]), wait_until="load")
    page.locator(".widget-slider").first.wait_for(state="visible", timeout=30_000)
    assert page.locator(".widget-slider").count() >= 2
    assert page.locator("button.jupyter-button").first.is_visible()
    assert not page.problems, page.problems


@pytest.mark.parametrize("mode", ["file", "http"])
def test_search_finds_all_reduce_in_three_lessons(mode, page, site_dir, request):
    """The built-in search (search.html?q=all-reduce) lists at least three lessons."""
    http_root = request.getfixturevalue("http_root") if mode == "http" else None
    page.goto(_url(mode, site_dir, http_root, "search.html") + "?q=all-reduce", wait_until="load")
    page.locator("#search-results .search-summary, #search-results p").first.wait_for(timeout=30_000)
    page.wait_for_function(
        "!document.querySelector('#search-progress') || document.querySelector('#search-progress').textContent === ''",
        timeout=30_000,
    )
    hrefs = page.eval_on_selector_all("#search-results a", "els => els.map(e => e.getAttribute('href'))")
    lessons = {h.split("/")[-1].split(".")[0] for h in hrefs if h and "lessons/" in h}
    assert len(lessons) >= 3, f"search for all-reduce found lessons {sorted(lessons)} (links: {hrefs[:20]})"
    assert not page.problems, page.problems
