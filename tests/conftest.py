import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
# numba's OpenMP threads (chapter 4's fused attention kernel) spin while they wait for work; with more
# threads than free cores (pytest-xdist workers, chapter kernels run by papermill, which inherit this)
# a kernel call then waits for descheduled spinners: 20x slower decoding steps on 2 shared cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Likewise OpenBLAS's threads: the tests' matrices are small, and two pytest-xdist workers already fill
# two cores; one BLAS thread per process is 2.5x faster there (set before numpy is first imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _chapter_seconds() -> dict:
    """Cold execution time of each chapter (data/chapter_resources.csv), {} if unreadable."""
    import csv

    try:
        with open(REPO / "data" / "chapter_resources.csv") as fh:
            rows = csv.DictReader(line for line in fh if not line.startswith("#"))
            return {r["chapter"]: float(r["seconds"]) for r in rows if r.get("cache") == "cold"}
    except (OSError, KeyError, ValueError):
        return {}


def pytest_collection_modifyitems(config, items):
    """Every test that uses the ``browser`` fixture (headless Chromium) or reads the built book (``site``)
    is marked ``browser``: make test builds the book, installs Chromium and runs them; make unit
    deselects them.

    The chapter executions (``notebook``) go first, longest chapter first, so that pytest-xdist's
    workers start them early and share out the short tests around them (the order of the others is
    kept)."""
    for item in items:
        if {"browser", "site"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)
    notebooks = [it for it in items if it.get_closest_marker("notebook")]
    if notebooks:
        secs = _chapter_seconds()

        def cost(it):
            return -max((v for k, v in secs.items() if k in it.name), default=0.0)

        rest = [it for it in items if not it.get_closest_marker("notebook")]
        items[:] = sorted(notebooks, key=cost) + rest


@pytest.fixture
def fixture_chapter(monkeypatch):
    """The tiny fixture chapter (tests/fixtures/99_fixture.md) registered as a chapter."""
    monkeypatch.setenv("KVBOOK_EXTRA_CHAPTERS", "99_fixture=tests.fixtures.fixture_schema:PARAMS")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return REPO / "tests" / "fixtures" / "99_fixture.md"


# The built book served on 127.0.0.1 and one headless Chromium per test module (the browser tests of
# test_browser.py and test_browser_layout.py share these; a module may define its own).
@pytest.fixture(scope="module")
def site():
    from tests import browser_helpers as bh

    if not (bh.SITE / "index.html").is_file():
        pytest.skip(f"{bh.SITE} is absent: build the book first (python -m analysis.build)")
    return bh.SITE


@pytest.fixture(scope="module")
def base_url(site):
    from tests import browser_helpers as bh

    with bh.serve(site) as url:
        yield url


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    from tests import browser_helpers as bh

    drv = bh.start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield drv
    drv.quit()
