"""Sphinx settings for the course's website (make site): the executed lessons, rendered offline.

The source tree is written by ``python -m coursetools.site`` (build/site-src);
this file is its configuration, copied there with the other pages. Nothing is
executed here (the runner executed the lessons) and no page loads anything
from another host: the widget manager, RequireJS and MathJax are the npm
packages pinned in tools/site/package-lock.json, copied into _static/offline.
"""

project = "Data-parallel training in JAX, from one device to many"
author = "The course's authors"
copyright = "the course's authors, Apache-2.0"

extensions = ["myst_nb"]
exclude_patterns = ["download/**", "_lessons.md", "_provenance.md", "**/.ipynb_checkpoints"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "myst.xref_missing", "misc.highlighting_failure"]

# The notebooks arrive executed; a lesson that failed never gets here (coursetools.site).
nb_execution_mode = "off"
nb_merge_streams = True
# Widgets from the saved widget state, with the manager served by the site itself.
nb_ipywidgets_js = {
    "offline/require.js": {},
    "offline/html-manager/embed-amd.js": {"data-jupyter-widgets-cdn": "./"},
}
mathjax_path = "offline/mathjax/tex-mml-svg.js"

html_theme = "sphinx_book_theme"
html_title = "Data-parallel training in JAX"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = [("file-search.js", {"priority": 300}), "accessible.js"]
# A favicon of its own, else the browser asks the server for /favicon.ico (a 404).
html_favicon = "_static/favicon.svg"
html_last_updated_fmt = None
html_copy_source = False
html_theme_options = {
    "use_download_button": False,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
# The theme's light/dark switch starts from this (an empty mode logs a console error).
html_context = {"default_mode": "light"}
# MathJax 4 with SVG output (no web fonts); its speech and Braille enrichment
# would fetch files with fetch(), which file:// pages may not do.
mathjax4_config = {
    "options": {"menuOptions": {"settings": {"enrich": False, "speech": False, "braille": False, "collapsible": False}}}
}
