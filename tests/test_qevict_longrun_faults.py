"""Long runs by units under faults (issue 31 items 1-2, issue 29 item 3): on a local Dask scheduler
with two worker processes, the worker computing a unit is SIGKILLed mid-unit; Dask computes that unit
again on a worker, no finished unit is lost, nothing half-written is left, and the artifact's tables are
those of a run on one process.  Ctrl-C on the command line keeps the finished units, exits 130 saying
how to resume, and the same command then computes only the rest.  Tiny random-weight model
(tests/_tiny_model.py) injected as the runs' loader."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from analysis.qevict import longrun_units as lu
from tests.test_qevict_longrun_units import EXACT, LOADER, RUN

REPO = Path(__file__).resolve().parent.parent
RUN3 = dict(RUN, documents=["needle:turtle", "code:argparse", "ref:assert"])


def _pid(marker):
    """The process that wrote a ``started-<pid>-<ns>`` marker (from its name: never a partial read)."""
    return int(marker.name.split("-")[1])


def _shas(path):
    return json.loads((path / "provenance.json").read_text())["tables"]


@pytest.mark.slow
def test_long_run_on_dask_survives_a_killed_worker(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("KVBOOK_TEST_MARKERS", str(markers))
    monkeypatch.setenv("KVBOOK_TEST_HOLD", "1")  # each unit, once started, waits for "release"
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    lines, result, errors = [], {}, []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = set(client.run(os.getpid).values())
        monkeypatch.delenv("KVBOOK_TEST_HOLD")  # the workers keep it; the driver's own check must not wait

        def started():
            return [p for p in markers.glob("started-*") if _pid(p) in workers]

        def drive():
            try:
                result["path"] = lu.run_entry(RUN3, loader=LOADER, dask=cluster.scheduler_address,
                                              say=lines.append)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=drive)
        t.start()
        deadline = time.time() + 180
        while not started() and time.time() < deadline and t.is_alive():
            time.sleep(0.05)
        assert started(), (errors, lines)
        victim = _pid(sorted(started(), key=lambda p: p.stat().st_mtime)[0])
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)  # mid-unit: its tables never reach the driver
        time.sleep(0.5)
        (markers / "release").write_text("")
        t.join(timeout=300)
        in_workers = [p for p in markers.glob("started-*") if _pid(p) != os.getpid()]
    assert not t.is_alive() and not errors, (errors, lines)
    assert len(in_workers) == 4, lines  # three units, the killed one twice
    folder = tmp_path / "results" / "tiny_long.units"
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 3 and all(n.endswith(".unit.pkl") for n in names), names  # nothing half-written
    prov = json.loads((result["path"] / "provenance.json").read_text())
    assert prov["units"]["computed"] == RUN3["documents"] and "--dask" in prov["command"]
    assert any("3/3 done, 0 remaining" in line for line in lines), lines
    # the same tables as one process computing every unit
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "serial"))
    serial = lu.run_entry(RUN3, loader=LOADER, say=lambda line: None)
    assert {t: _shas(serial)[t] for t in EXACT} == {t: _shas(result["path"])[t] for t in EXACT}


@pytest.mark.slow
def test_ctrl_c_keeps_finished_units_and_the_same_command_resumes(tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump({"runs": [RUN3]}))
    env = dict(os.environ, KVBOOK_RESULTS=str(tmp_path / "results"), KVBOOK_LONGRUN_LOADER=LOADER,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-W", "ignore", "-m", "analysis.qevict.longrun_units", str(cfg)]
    folder = tmp_path / "results" / "tiny_long.units"
    # SIGINT at its default (a test started in the background inherits it ignored, and Python keeps that)
    p = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.time()
        while not list(folder.glob("*.unit.pkl")) and p.poll() is None and time.time() - t0 < 300:
            time.sleep(0.05)
        assert p.poll() is None, p.stdout.read()
        os.killpg(p.pid, signal.SIGINT)
        log, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and "every finished unit is kept" in log and "same command resumes" in log, log
    kept = len(list(folder.glob("*.unit.pkl")))
    assert 1 <= kept < 3 and not (tmp_path / "results" / "tiny_long").exists()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{kept} kept" in r.stdout and f"{3 - kept} to compute" in r.stdout
    assert "== 1 run(s) written" in r.stdout
    assert (tmp_path / "results" / "tiny_long" / "provenance.json").is_file()
