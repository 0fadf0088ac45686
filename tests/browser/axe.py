"""axe-core in a Playwright page: the serious and critical accessibility violations, one line each.

axe-core is the npm package pinned in tools/site/package-lock.json (``npm ci``
there, as for the site's MathJax); it is injected from that file, so no page
loads anything from another host.
"""

from __future__ import annotations

from pathlib import Path

AXE_JS = Path(__file__).resolve().parents[2] / "tools" / "site" / "node_modules" / "axe-core" / "axe.min.js"
SEVERE = ("serious", "critical")

_RUN = """async ([include, exclude]) => {
  const context = {include: include.length ? include.map(s => [s]) : [document], exclude: exclude.map(s => [s])};
  const result = await axe.run(context, {resultTypes: ['violations']});
  return result.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map(n => n.target.join(' ')), count: v.nodes.length,
  }));
}"""


def missing() -> str | None:
    """Why axe-core cannot run here (with the command that fixes it), or None."""
    if AXE_JS.is_file():
        return None
    return f"axe-core is not installed ({AXE_JS} is missing): run `cd tools/site && npm ci`."


def severe_violations(page, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> list[str]:
    """Run axe-core on ``page``; one line per serious or critical rule.

    ``include``: CSS selectors of the parts to check (default the whole
    page); ``exclude``: parts inside them to leave out.

    Raises:
        FileNotFoundError: axe-core is not installed (:func:`missing` says how).
    """
    reason = missing()
    if reason:
        raise FileNotFoundError(reason)
    page.add_script_tag(path=str(AXE_JS))
    found = page.evaluate(_RUN, [list(include), list(exclude)])
    return [
        f"{v['id']} ({v['impact']}, {v['count']} element(s), e.g. {', '.join(v['nodes'])}): {v['help']}"
        for v in found
        if v["impact"] in SEVERE
    ]
