"""The maintainers' toolkit: running the course headlessly, the learner's workspace, the site, timings and reports.

It lives in the repository beside the learner's library (``dpcourse``), is not
part of its wheel, and may import ``dpcourse``; the library never imports it.
:mod:`coursetools.paths` is the one module that knows the repository's
layout. One command line: ``python -m coursetools`` (:mod:`coursetools.cli`).
"""
