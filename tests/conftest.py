import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


@pytest.fixture
def fixture_chapter(monkeypatch):
    """The tiny fixture chapter (tests/fixtures/99_fixture.md) registered as a chapter."""
    monkeypatch.setenv("KVBOOK_EXTRA_CHAPTERS", "99_fixture=tests.fixtures.fixture_schema:PARAMS")
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return REPO / "tests" / "fixtures" / "99_fixture.md"
