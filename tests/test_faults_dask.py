"""A sweep on Dask survives the loss of a worker (issue 31, item 2): a local scheduler with two
worker processes, the one running a chapter SIGKILLed mid-run; Dask reschedules the run on the
other worker, every run succeeds once, ``results.csv`` has one row per run, and the killed run's
temporary directory is removed (and reported) when the sweep ends."""
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis import rerun

REPO = Path(__file__).resolve().parent.parent

# A chapter that says which process runs it (its kernel's parent: the worker) and waits, mid-run,
# until the test lets it go.
CHAPTER = """\
---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---

# Fault-injection chapter

```{code-cell} ipython3
:tags: [parameters]

x = 1
marker_dir = ""
```

```{code-cell} ipython3
import os
import time
from pathlib import Path

d = Path(marker_dir)
(d / f"started-{x}-{os.getpid()}").write_text(str(os.getppid()))
t0 = time.time()
while not (d / "release").exists() and time.time() - t0 < 120:
    time.sleep(0.05)
```

```{code-cell} ipython3
from analysis.report import glue

glue("square", x * x)
```
"""

SCHEMA = """\
from analysis.params import Param

PARAMS = {"x": Param(1, "int", "a number", min=0, max=100),
          "marker_dir": Param("", "str", "where the run says it started", nonempty=False)}
"""


@pytest.mark.notebook
def test_sweep_on_dask_survives_a_killed_worker(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    (tmp_path / "98_faults.md").write_text(CHAPTER)
    (tmp_path / "faults_schema.py").write_text(SCHEMA)
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("KVBOOK_EXTRA_CHAPTERS", "98_faults=faults_schema:PARAMS")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO),
                                                     os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {tmp_path / '98_faults.md'}\nname: fk\n"
                     f"fixed: {{marker_dir: '{markers}'}}\ngrid:\n  x: [1, 2]\n")
    out = tmp_path / "runs"
    result, errors = {}, []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = set(client.run(os.getpid).values())

        def sweep_thread():
            try:
                result["df"] = rerun.run_sweep(sweep, out_root=out, dask=cluster.scheduler_address,
                                               progress=False)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=sweep_thread)
        t.start()
        deadline = time.time() + 120
        while not list(markers.glob("started-*")) and time.time() < deadline:
            time.sleep(0.05)
        first = sorted(markers.glob("started-*"), key=lambda p: p.stat().st_mtime)[0]
        victim = int(first.read_text())
        assert victim in workers, "the chapter's kernel runs under a Dask worker process"
        time.sleep(0.5)  # the run is mid-chapter: inside its temporary directory, notebook half written
        partials = sorted(p.name for p in (out / "fk").glob("*.partial-*"))
        assert partials
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        (markers / "release").write_text("")  # the other runs (and the rescheduled one) may finish
        t.join(timeout=180)
    assert not t.is_alive() and not errors, errors
    df = result["df"]
    assert len(df) == 2 and df["run_id"].is_unique and (df["status"] == "ok").all(), df
    assert sorted(df["glue.square"]) == [1, 4]
    table = pd.read_csv(out / "fk" / "results.csv")
    assert len(table) == 2 and table["run_id"].is_unique and (table["status"] == "ok").all()
    started = [p.name.split("-")[1] for p in markers.glob("started-*")]
    assert len(started) == 3  # two runs, one of them twice: killed, then rescheduled
    names = sorted(p.name for p in (out / "fk").iterdir())
    assert not any(".partial-" in n or ".old-" in n or n.endswith(".tmp") for n in names), names
    assert names == sorted(list(df["run_id"]) + ["results.csv", "summary.json"])
    killed = df.attrs["summary"]["removed_after"]
    assert len(killed) == 1 and killed[0] in partials  # the killed run's directory, removed and reported


def _fault_chapter(tmp_path: Path, name: str, xs) -> tuple[Path, Path, dict]:
    (tmp_path / "98_faults.md").write_text(CHAPTER)
    (tmp_path / "faults_schema.py").write_text(SCHEMA)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = dict(os.environ, KVBOOK_EXTRA_CHAPTERS="98_faults=faults_schema:PARAMS",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")]))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"chapter: {tmp_path / '98_faults.md'}\nname: {name}\n"
                     f"fixed: {{marker_dir: '{markers}'}}\ngrid:\n  x: {list(xs)}\n")
    return sweep, markers, env


@pytest.mark.notebook
@pytest.mark.slow
def test_sweep_interrupted_stops_at_once_and_resumes(tmp_path):
    """Ctrl-C on a local sweep (two worker processes): the runs in progress stop, the queued one never
    starts, the command says how to resume; --resume then removes the interrupted runs' temporary
    directories (reported) and executes exactly the runs that had not finished."""
    import subprocess
    import sys

    sweep, markers, env = _fault_chapter(tmp_path, "fi", [1, 2, 3])
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "analysis.rerun", "--sweep", str(sweep), "--jobs", "2", "--out", str(out)]
    # SIGINT at its default in the command (a process started with SIGINT ignored, as a test run in the
    # background is, passes that on, and Python then never raises KeyboardInterrupt)
    p = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.time()
        while len(list(markers.glob("started-*"))) < 2 and p.poll() is None and time.time() - t0 < 180:
            time.sleep(0.1)
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)
        t1 = time.time()
        log, _ = p.communicate(timeout=120)
        stopped_in = time.time() - t1
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and "sweep interrupted" in log and "--resume" in log, log[-3000:]
    assert stopped_in < 60  # the chapter would hold its runs for 120 s
    assert sorted(m.name.split("-")[1] for m in markers.glob("started-*")) == ["1", "2"]  # 3 never started
    left = sorted(d.name for d in (out / "fi").iterdir() if ".partial-" in d.name)
    assert len(left) == 2  # the interrupted runs' directories, no finished run among them
    (markers / "release").write_text("")
    r = subprocess.run(cmd + ["--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "0 finished run(s) kept" in r.stderr and all(name in r.stderr for name in left)
    table = pd.read_csv(out / "fi" / "results.csv")
    assert sorted(table["glue.square"]) == [1, 4, 9] and (table["status"] == "ok").all()
    assert not any(".partial-" in d.name for d in (out / "fi").iterdir())
