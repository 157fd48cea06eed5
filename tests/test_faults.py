"""Faults an operator meets (issue 31): interrupted writes, crashed runs' leftovers, resumed sweeps.

The Dask lost-worker sweep is in tests/test_faults_dask.py, the interrupted book build in
tests/test_faults_build.py."""
import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis import artifacts, cache, rerun

REPO = Path(__file__).resolve().parent.parent


def _interrupting_writer(text="half a table"):
    def write(tmp):
        Path(tmp).write_text(text)  # something is on disk already ...
        raise KeyboardInterrupt  # ... when Ctrl-C arrives
    return write


# ------------------------------------------------------------------------------- atomic writes

def test_atomic_write_interrupted_keeps_the_old_file_and_no_temporary(tmp_path):
    f = tmp_path / "results.csv"
    artifacts.atomic_write(f, "a,b\n1,2\n")
    f.chmod(0o640)
    with pytest.raises(KeyboardInterrupt):
        artifacts.atomic_write(f, write=_interrupting_writer())

    def disk_full(tmp):
        Path(tmp).write_text("a,b\n3")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        artifacts.atomic_write(f, write=disk_full)
    assert f.read_text() == "a,b\n1,2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary file left
    artifacts.atomic_write(f, b"new\n")
    assert f.read_bytes() == b"new\n" and (f.stat().st_mode & 0o777) == 0o640  # mode kept
    with pytest.raises(TypeError):
        artifacts.atomic_write(f)


def test_sweep_results_table_write_interrupted_keeps_the_old_table(tmp_path, monkeypatch):
    rows = [{"run_id": "a", "status": "ok"}]
    rerun._write_results(rows, {"a": 0}, tmp_path)
    before = (tmp_path / "results.csv").read_text()

    def half(self, path, **kw):
        Path(path).write_text("run_id,sta")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", half)
    with pytest.raises(KeyboardInterrupt):
        rerun._write_results(rows + [{"run_id": "b", "status": "ok"}], {"a": 0, "b": 1}, tmp_path)
    assert (tmp_path / "results.csv").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "kvbook_faults_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(mod))
    return tmp_path / "results"


def test_artifact_write_interrupted_keeps_the_old_artifact(tmp_results, monkeypatch):
    kw = dict(modules=["kvbook_faults_mod"], command="make demo", wall_seconds=1.0)
    artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1]))}, **kw)
    old = (tmp_results / "demo" / "provenance.json").read_text()

    def ctrl_c(*a):  # after the old folder was moved aside, before the new one moved in
        raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, "replace", ctrl_c)
        artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[2]))}, **kw)
    # the old artifact is back in place, whole; no temporary or moved-aside folder is left
    assert sorted(p.name for p in tmp_results.iterdir()) == ["demo"]
    assert (tmp_results / "demo" / "provenance.json").read_text() == old
    assert list(artifacts.read_artifact("demo").tables["t"]["a"]) == [1]
    artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[3]))}, **kw)  # the next write completes
    assert sorted(p.name for p in tmp_results.iterdir()) == ["demo"]
    assert list(artifacts.read_artifact("demo").tables["t"]["a"]) == [3]


def test_artifact_tables_failing_midway_leave_the_old_artifact_whole(tmp_results, monkeypatch):
    kw = dict(modules=["kvbook_faults_mod"], command="make demo", wall_seconds=1.0)
    artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1])), "u": pd.DataFrame(dict(b=[1]))}, **kw)

    class Bad(pd.DataFrame):
        def to_csv(self, path, **k):
            Path(path).write_text("b\n")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[2])), "u": Bad(dict(b=[2]))}, **kw)
    assert sorted(p.name for p in tmp_results.iterdir()) == ["demo"]
    a = artifacts.read_artifact("demo")
    assert list(a.tables["t"]["a"]) == [1] and not a.stale


def test_result_cache_write_interrupted_leaves_no_entry_and_no_temporary(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_CACHE", str(tmp_path))

    class Unpicklable:
        def __reduce__(self):
            raise KeyboardInterrupt  # Ctrl-C while the entry is being written

    with pytest.raises(KeyboardInterrupt):
        cache.cached("faults", {"n": 1}, Unpicklable, code=False)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert cache.cached("faults", {"n": 1}, lambda: 42, code=False) == 42


# --------------------------------------------------------------------- leftovers of crashed runs

def _owned_partial(out_dir: Path, name: str) -> Path:
    """A run's temporary directory as a run that crashed left it: an owner file nobody locks."""
    d = out_dir / name
    d.mkdir(parents=True)
    (d / rerun.OWNER).write_text('{"pid": 1}\n')
    (d / "params.json").write_text("{}")
    return d


def test_a_killed_run_releases_its_temporary_directory(tmp_path):
    """The lock on a run's temporary directory dies with its process (SIGKILL: no cleanup runs)."""
    d = tmp_path / "r-1.partial-abc"
    d.mkdir()
    code = ("import sys, time; from pathlib import Path; from analysis import rerun; "
            "h = rerun._hold_partial(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert not rerun._is_abandoned(d, time.time())  # alive: left alone
        assert rerun.clean_partials(tmp_path) == [] and d.is_dir()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert rerun._is_abandoned(d, time.time())
    assert rerun.clean_partials(tmp_path) == [d.name] and not d.exists()


def test_sweep_removes_and_reports_what_crashed_runs_left(tmp_path, fixture_chapter, monkeypatch, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\nname: fz\ngrid:\n  x: [1, 2]\n")
    out = tmp_path / "runs" / "fz"
    crashed = _owned_partial(out, "99_fixture-aaaa.partial-1x2y")  # a killed run's
    legacy = out / "99_fixture-bbbb.partial-3z4w"  # from code before owner files, an hour old
    legacy.mkdir()
    os.utime(legacy, (time.time() - 2 * rerun.PARTIAL_GRACE_S,) * 2)
    recent = out / "99_fixture-cccc.partial-5v6u"  # no owner file yet, just made: may be live
    recent.mkdir()
    live = _owned_partial(out, "99_fixture-dddd.partial-7t8s")
    held = rerun._hold_partial(live)  # a run of another process, still running
    old_copy = out / "99_fixture-eeee.old-0a1b2c3d"  # an interrupted replacement's leftover
    old_copy.mkdir()
    tmp_table = out / ".results.csv.k3j4.tmp"  # a table write killed midway
    tmp_table.write_text("run_id,st")
    os.utime(tmp_table, (time.time() - 120,) * 2)
    left_during = []

    def fake(task):  # a run that succeeds while another run of the sweep crashes on a lost worker
        path, ov = rerun.prepare(task[0], task[1])
        if not left_during:
            left_during.append(_owned_partial(out, f"{rerun.run_id(path.stem, ov)}.partial-lost"))
        return {"run_id": rerun.run_id(path.stem, ov), "status": "ok", "error": "", "param.x": ov["x"]}

    monkeypatch.setattr(rerun, "_execute_star", fake)
    try:
        df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=True)
    finally:
        held.close()
    s = df.attrs["summary"]
    assert s["removed_before"] == sorted([crashed.name, legacy.name, old_copy.name, tmp_table.name])
    assert s["removed_after"] == [left_during[0].name]
    assert json.loads((out / "summary.json").read_text())["removed_before"] == s["removed_before"]
    assert s["ok"] == 2 and s["failed"] == 0
    err = capsys.readouterr().err
    assert "left by crashed runs before the sweep" in err and crashed.name in err
    assert "after the sweep" in err and left_during[0].name in err
    assert live.is_dir() and recent.is_dir()  # a live run's directory is never touched
    assert not crashed.exists() and not legacy.exists() and not old_copy.exists() and not tmp_table.exists()


def test_a_single_run_removes_what_crashed_runs_of_its_chapter_left(tmp_path, fixture_chapter, monkeypatch,
                                                                     capsys):
    crashed = _owned_partial(tmp_path / "99_fixture", "99_fixture-aaaa.partial-1x2y")
    monkeypatch.setattr(rerun, "execute", lambda path, ov, out, **kw: {"status": "ok", "path": str(out),
                                                                       "seconds": 0.1})
    assert rerun.main([str(fixture_chapter), "-p", "x", "3", "--out", str(tmp_path)]) == 0
    assert not crashed.exists() and crashed.name in capsys.readouterr().err


def test_a_finished_run_has_no_owner_file_and_nothing_partial_is_left(tmp_path, fixture_chapter, monkeypatch):
    import papermill as pm

    def fake_execute(nb, out, **kw):
        import nbformat
        assert (Path(out).parent / rerun.OWNER).is_file()  # held while the notebook runs
        nbformat.write(nbformat.v4.new_notebook(), out)

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    row = rerun.execute(fixture_chapter, {"x": 4}, tmp_path)
    assert row["status"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == [row["run_id"]]
    assert not (tmp_path / row["run_id"] / rerun.OWNER).exists()


# ----------------------------------------------------------------------------------------- resume

def test_resume_keeps_current_finished_runs_and_reruns_the_rest(tmp_path, fixture_chapter, monkeypatch,
                                                                capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\nname: fr\ngrid:\n  x: [1, 2, 3, 4]\n")
    out = tmp_path / "runs" / "fr"
    prov = rerun.provenance(fixture_chapter)
    rid = {x: rerun.run_id("99_fixture", {"x": x}) for x in (1, 2, 3, 4)}

    def finished(x, **over):
        (out / rid[x]).mkdir(parents=True)
        row = {"run_id": rid[x], "chapter": "99_fixture.md", "param.x": x, **prov, "status": "ok",
               "error": "", "glue.square": x * x, **over}
        pd.DataFrame([row]).to_csv(out / rid[x] / "result.csv", index=False)

    finished(1)  # current: kept
    finished(2, code_hash="0123456789abcdef")  # computed with other code: run again
    finished(3, data_hash="fedcba9876543210")  # with other data: run again
    ran = []

    def fake(task):
        path, ov = rerun.prepare(task[0], task[1])
        ran.append(ov["x"])
        return {"run_id": rerun.run_id(path.stem, ov), "status": "ok", "error": "", "param.x": ov["x"],
                "glue.square": ov["x"] ** 2}

    monkeypatch.setattr(rerun, "_execute_star", fake)
    df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=True, resume=True)
    assert sorted(ran) == [2, 3, 4]
    assert list(df["param.x"]) == [1, 2, 3, 4] and list(df["glue.square"]) == [1, 4, 9, 16]
    assert df.attrs["summary"]["resumed"] == [rid[1]]
    assert df.attrs["summary"]["executed"] == sorted(rid[x] for x in (2, 3, 4))
    assert "1 finished run(s) kept" in capsys.readouterr().err
    ran.clear()
    rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=False)  # without --resume: all
    assert sorted(ran) == [1, 2, 3, 4]


def _slow_counted(marks: str):
    """A computation that records each time it runs and takes long enough for a second process to ask."""
    import time as _t

    with open(marks, "a") as fh:
        fh.write("x")
    _t.sleep(1.5)
    return 7


def _ask(cache_dir: str, marks: str):
    import os as _os

    _os.environ["KVBOOK_CACHE"] = cache_dir
    return cache.cached("lock", {"n": 1}, functools.partial(_slow_counted, marks), code=False)


def test_two_processes_asking_for_one_key_compute_it_once(tmp_path):
    """A chapter and its evidence page execute in parallel and may ask for the same result: the second
    waits for the first's entry instead of computing it again; no lock file is left."""
    marks = tmp_path / "marks"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.starmap(_ask, [(str(tmp_path / "c"), str(marks))] * 2)
    assert got == [7, 7]
    assert marks.read_text() == "x"
    assert [p.name for p in (tmp_path / "c" / "lock").iterdir() if not p.name.endswith(".pkl")] == []
