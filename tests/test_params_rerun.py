"""Parameter validation and papermill reruns: single runs, sweeps (process pool and Dask)."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis import chapters, params, rerun

REPO = Path(__file__).resolve().parent.parent


def test_validate_collects_every_problem():
    sch = chapters.schema("01_kv_footprint")
    with pytest.raises(params.ParameterError) as e:
        params.validate(sch, {"dtype": "fp7", "batch": "4", "context_tokens": -3, "modles": []}, partial=True)
    msg = str(e.value)
    assert "dtype: 'fp7' is not allowed" in msg and "bf16" in msg
    assert "batch: expected an integer, got str" in msg
    assert "context_tokens: -3 is below the minimum 1" in msg
    assert "modles: unknown parameter (did you mean models?)" in msg


def test_unknown_model_in_list():
    with pytest.raises(params.ParameterError, match=r"models\[1\]: 'Llama-9' is not allowed"):
        params.validate(chapters.schema("01_kv_footprint"), {"models": ["Llama-3.1-8B", "Llama-9"]},
                        partial=True)


def test_bool_is_not_an_int_and_int_is_a_float():
    sch = {"n": params.Param(1, "int"), "x": params.Param(1.0, "float"), "b": params.Param(False, "bool")}
    with pytest.raises(params.ParameterError, match="n: expected an integer, got bool"):
        params.validate(sch, {"n": True, "x": 1, "b": False})
    assert params.validate(sch, {"n": 3, "x": 2, "b": True}) == {"n": 3, "x": 2.0, "b": True}
    with pytest.raises(params.ParameterError, match="b: expected true/false"):
        params.validate(sch, {"n": 3, "x": 2, "b": "yes"})


def test_check_fills_namespace_and_requires_every_parameter():
    sch = chapters.schema("01_kv_footprint")
    ns = sch.defaults()
    sch.check(ns)
    ns.pop("dtype")
    with pytest.raises(params.ParameterError, match="lacks"):
        sch.check(ns)


def test_every_chapter_default_is_valid():
    for stem in chapters.CHAPTERS:
        if (REPO / "book" / f"{stem}.md").exists():
            sch = chapters.schema(stem)
            params.validate(sch, sch.defaults())


def test_cli_rejects_bad_parameter_before_running(tmp_path):
    r = subprocess.run([sys.executable, "-m", "analysis.rerun", "book/01_kv_footprint.md", "-p", "dtype",
                        "fp7", "-p", "context_tokens", "1.5", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "dtype" in r.stderr and "context_tokens" in r.stderr and "allowed" in r.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_cli_unknown_chapter(tmp_path):
    r = subprocess.run([sys.executable, "-m", "analysis.rerun", "book/07_nope.md", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "01_kv_footprint.md" in r.stderr


@pytest.mark.notebook
def test_single_run_writes_notebook_and_result_row(tmp_path):
    r = subprocess.run([sys.executable, "-m", "analysis.rerun", "book/01_kv_footprint.md", "-p",
                        "context_tokens", "1048576", "-p", "dtype", "fp8", "-p", "models",
                        "[Llama-3.1-70B, DeepSeek-V3]", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    runs = list((tmp_path / "01_kv_footprint").iterdir())
    assert len(runs) == 1 and not runs[0].name.endswith((".partial", ".failed"))
    row = pd.read_csv(runs[0] / "result.csv").iloc[0]
    assert row["param.dtype"] == "fp8" and row["param.context_tokens"] == 1048576
    assert row["status"] == "ok"
    # glued values are the chapter's computation under these parameters
    assert row["glue.ch1_llama70b_kv_bytes"] == 327680.0
    assert row["glue.ch1_n_models"] == 2
    assert (runs[0] / "01_kv_footprint.ipynb").is_file()


@pytest.mark.notebook
def test_sweep_reports_failures_and_finishes_the_rest(tmp_path, fixture_chapter):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\nname: fx\ngrid:\n  x: [3, 4]\n  fail: [false, true]\n")
    df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=False)
    assert len(df) == 4
    ok = df[df.status == "ok"].sort_values("param.x")
    assert list(ok["glue.square"]) == [9, 16]
    bad = df[df.status == "failed"]
    assert len(bad) == 2 and all("asked to fail" in e for e in bad["error"])
    table = pd.read_csv(tmp_path / "runs" / "fx" / "results.csv")
    assert len(table) == 4
    dirs = sorted(p.name for p in (tmp_path / "runs" / "fx").iterdir() if p.is_dir())
    assert sum(d.endswith(".failed") for d in dirs) == 2 and not any(".partial" in d for d in dirs)


def test_sweep_with_an_invalid_point_runs_nothing(tmp_path, fixture_chapter):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\ngrid:\n  x: [3, -1, 'a']\n")
    with pytest.raises(params.ParameterError, match="2 of 3 runs are invalid"):
        rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=False)
    assert not (tmp_path / "runs").exists()


@pytest.mark.notebook
def test_sweep_on_dask_local_cluster(tmp_path, fixture_chapter):
    from distributed import LocalCluster

    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\nname: fxd\ngrid:\n  x: [5, 6]\n")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        df = rerun.run_sweep(sweep, out_root=tmp_path / "runs", dask=cluster.scheduler_address,
                             progress=False)
    assert sorted(df["glue.square"]) == [25, 36]
    assert (tmp_path / "runs" / "fxd" / "results.csv").is_file()


@pytest.mark.notebook
def test_sweep_process_pool_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "analysis.rerun", "--sweep",
                        "sweeps/smoke_01_kv_footprint.yaml", "--jobs", "2", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "smoke_01_kv_footprint" / "results.csv")
    assert (df.status == "ok").all()


def test_sweep_duplicate_points_run_once(tmp_path, fixture_chapter):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\ngrid:\n  x: [3, 3, 4]\n"
                     "runs:\n  - {x: 4}\n  - {x: 5}\n")
    _, _, points = rerun.load_sweep(sweep)
    assert points == [{"x": 3}, {"x": 4}, {"x": 5}]


def test_papermill_injected_unknown_parameter_is_rejected(fixture_chapter):
    ns = {"x": 2, "fail": False, "In": ["", "x = 2\nfail = False", "# Parameters\nx = 3\nfal = True\n"]}
    with pytest.raises(params.ParameterError, match=r"fal: unknown parameter \(did you mean fail\?\)"):
        chapters.schema("99_fixture").check(ns)
    assert params.injected_names(ns) == ["x", "fal"]
    ns["In"][-1] = "# Parameters\nx = 3\n"
    assert chapters.schema("99_fixture").check(ns) == {"x": 2, "fail": False}
    assert params.injected_names({"x": 1}) == []  # not in IPython: nothing injected


@pytest.mark.notebook
def test_papermill_typo_fails_the_fixture_chapter(tmp_path, fixture_chapter):
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="unknown parameter"):
        pm.execute_notebook(rerun._read_notebook(fixture_chapter), str(tmp_path / "o.ipynb"),
                            parameters={"x": 3, "fial": True}, kernel_name="python3", progress_bar=False,
                            cwd=str(fixture_chapter.parent))


@pytest.mark.notebook
def test_failed_rerun_moves_the_earlier_result_aside(tmp_path, fixture_chapter, monkeypatch, capfd):
    out = tmp_path / "runs"
    ok = rerun.execute(fixture_chapter, {"x": 7}, out)
    assert ok["status"] == "ok"
    row = pd.read_csv(Path(ok["path"]) / "result.csv").iloc[0]
    assert len(row["code_hash"]) == 16 and len(row["data_hash"]) == 16 and row["date"].startswith("20")
    assert "without encryption" not in capfd.readouterr().err  # the kernel's TCP warning (CurveZMQ now)
    # the same run id fails later (here: the chapter's code changed under it)
    real = rerun._read_notebook

    def broken(path):
        nb = real(path)
        nb.cells[-1].source = "raise RuntimeError('the code changed and now fails')"
        return nb

    monkeypatch.setattr(rerun, "_read_notebook", broken)
    bad = rerun.execute(fixture_chapter, {"x": 7}, out)
    assert bad["status"] == "failed" and bad["run_id"] == ok["run_id"]
    rid = ok["run_id"]
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"{rid}.failed", f"{rid}.stale"]  # nothing at runs/<rid>/ looks current
    assert "failed on" in (out / f"{rid}.stale" / "STALE.txt").read_text()
    monkeypatch.setattr(rerun, "_read_notebook", real)
    again = rerun.execute(fixture_chapter, {"x": 7}, out)
    assert again["status"] == "ok" and sorted(p.name for p in out.iterdir()) == [rid]


def test_results_table_is_written_as_runs_finish_and_survives_a_crashed_worker(tmp_path, fixture_chapter,
                                                                              monkeypatch):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {fixture_chapter}\nname: fc\ngrid:\n  x: [1, 2, 3]\n")
    seen = []

    def fake(task):
        table = tmp_path / "runs" / "fc" / "results.csv"
        seen.append(len(pd.read_csv(table)) if table.exists() else 0)
        if task[1]["x"] == 2:
            raise MemoryError("killed")  # the worker dies: no row comes back from it
        path, ov = rerun.prepare(task[0], task[1])
        return {"run_id": rerun.run_id(path.stem, ov), "status": "ok", "error": "", "param.x": ov["x"]}

    monkeypatch.setattr(rerun, "_execute_star", fake)
    df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=False)
    assert seen == [0, 1, 2]  # the table held every finished run when the next one started
    assert list(df["param.x"]) == [1, 2, 3] and list(df["status"]) == ["ok", "failed", "ok"]
    assert "worker crashed: MemoryError: killed" in df["error"][1]


def test_concurrent_runs_of_one_id_never_share_a_directory(tmp_path, fixture_chapter, monkeypatch):
    """Two runs of the same point at once: each writes its own temporary directory."""
    import threading

    import papermill as pm

    made, barrier = [], threading.Barrier(2)

    def fake_execute(nb, out, **kw):
        made.append(Path(out).parent)
        barrier.wait(timeout=30)  # both runs are inside their temporary directories now
        import nbformat
        nbformat.write(nbformat.v4.new_notebook(), out)

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    threads = [threading.Thread(target=rerun.execute, args=(fixture_chapter, {"x": 9}, tmp_path))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 2 and made[0] != made[1]
    assert [p.name for p in tmp_path.iterdir()] == [rerun.run_id("99_fixture", {"x": 9})]
