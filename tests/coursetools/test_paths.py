"""coursetools.paths: the repository's folders, found from the toolkit's own place in it."""

from coursetools import paths


def test_every_named_folder_and_file_is_the_repositorys():
    assert (paths.ROOT / "Makefile").is_file() and (paths.ROOT / "dpcourse" / "__init__.py").is_file()
    for folder in (paths.NOTEBOOKS, paths.SOLUTIONS, paths.BASELINES, paths.DOCS, paths.SITE_PAGES):
        assert folder.is_dir(), folder
    assert paths.TIMINGS.is_file() and paths.README.is_file()
    assert sorted(p.name for p in paths.NOTEBOOKS.glob("01_*.py")) == ["01_setup.py"]
