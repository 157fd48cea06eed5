"""Every chapter executed through papermill with its small parameter set (sweeps/smoke_*.yaml:
``make smoke``, which CI runs after ``make test``), and every page's reads in the book build checked
against its execution-cache key (``make test``, reusing the build's execution)."""
import json
from pathlib import Path

import pytest

from analysis import build, deps, execute, rerun

REPO = Path(__file__).resolve().parent.parent
SMOKE = sorted((REPO / "sweeps").glob("smoke_*.yaml"))


def test_every_chapter_has_a_smoke_sweep():
    chapters = {p.stem for p in (REPO / "book").glob("[0-9][0-9]_*.md")}
    covered = {rerun.load_sweep(s)[0].stem for s in SMOKE}
    assert chapters <= covered, f"chapters without sweeps/smoke_<chapter>.yaml: {sorted(chapters - covered)}"


@pytest.mark.smoke
@pytest.mark.notebook
@pytest.mark.parametrize("sweep", SMOKE, ids=[s.stem for s in SMOKE])
def test_chapter_executes_with_small_parameters(sweep, tmp_path, monkeypatch):
    reads = tmp_path / "reads.log"
    monkeypatch.setenv("KVBOOK_TRACE_READS", str(reads))  # the kernel inherits it (analysis.data)
    df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path, progress=False)
    failed = df[df.status != "ok"]
    assert failed.empty, failed[["run_id", "error"]].to_string()
    glued = [c for c in df.columns if c.startswith("glue.")]
    assert glued, "the chapter glued no values"
    assert df[glued].notna().all().all()
    # every file the chapter read is part of its execution-cache key (analysis.deps, static)
    read = set(reads.read_text().split()) if reads.exists() else set()
    chapter = rerun.load_sweep(sweep)[0]
    static = set(deps.chapter_deps(chapter)["files"])
    assert read or not static, "no read was recorded (KVBOOK_TRACE_READS not honoured?)"
    assert read <= static, f"read but missing from the key of {chapter.name}: {sorted(read - static)}"


def test_every_file_a_page_read_in_the_build_is_in_its_key(site):
    """The book build (analysis.execute) records the repository files each page's kernel reads: each
    must be in the page's execution-cache key (analysis.deps, static), or a change to it would not
    re-execute the page. Pages whose key changed since their record need a build first."""
    keys = {Path(k).stem: deps.digest(v) for k, v in build.plan().items()}
    stale, missing = [], []
    for page in build.pages():
        f = execute.reads_file(build.READS, page)
        if not f.exists():
            missing.append(page.stem)
            continue
        rec = json.loads(f.read_text())
        if rec["key"] != keys[page.stem]:
            stale.append(page.stem)
            continue
        static = set(deps.chapter_deps(page)["files"])
        read = set(rec["reads"])
        assert read or not static, f"{page.stem}: no read was recorded (KVBOOK_TRACE_READS not honoured?)"
        assert read <= static, f"read but missing from the key of {page.name}: {sorted(read - static)}"
    if missing or stale:
        pytest.skip(f"no current record of the reads of {missing + stale}: run `make book` (with more "
                    "than one job) first")
