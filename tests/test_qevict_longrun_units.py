"""Long runs by (document, model) units (issue 31 item 1, issue 29 item 3): each finished unit is kept
with its code hash; an interrupted run resumed writes the same artifact, bit for bit (every table but
``timings``, which holds wall-clock seconds and memory), as one never interrupted and as
``longrun.execute`` over all documents; stale units are recomputed and named; bad input is refused
with what to do.  On a tiny random-weight model (tests/_tiny_model.py), injected as the runs' loader."""
import hashlib
import json
import pickle
import shutil

import pandas as pd
import pytest
import yaml

from analysis import artifacts
from analysis.qevict import longrun
from analysis.qevict import longrun_units as lu

LOADER = "tests._tiny_model:longrun_loader"
# two documents: a needle one (free-run answers: a "generated" column) and a code one (none)
RUN = dict(name="tiny_long", model="smollm2", documents=["needle:turtle", "code:argparse"],
           prefill_tokens=128, decode_tokens=40, n_needles=1, n_queries=1,
           policies=["full", "streaming", "qevict_dequant"], budgets=[0.5],
           lir_gap_steps=8, free_run=True, tuned_settings="none", notes="tiny")
EXACT = ("summary", "drift", "drift_ends")  # every table but timings (the slow test adds settings)


def _shas(path):
    return json.loads((path / "provenance.json").read_text())["tables"]


def _run(results, monkeypatch, run=RUN, **kw):
    monkeypatch.setenv("KVBOOK_RESULTS", str(results))
    lines = []
    say = kw.pop("say", lines.append)
    path = lu.run_entry(run, loader=LOADER, say=say, **kw)
    return path, lines


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run never interrupted: (results folder, artifact path, progress lines)."""
    results = tmp_path_factory.mktemp("whole") / "results"
    with pytest.MonkeyPatch.context() as mp:
        path, lines = _run(results, mp)
    return results, path, lines


def test_whole_run_writes_every_unit_and_the_artifact(uninterrupted):
    results, path, lines = uninterrupted
    units = sorted((results / "tiny_long.units").glob("*.unit.pkl"))
    assert len(units) == 2
    for f in units:
        rec = pickle.loads(f.read_bytes())
        assert rec["model"] == "smollm2" and rec["document"] in RUN["documents"]
        assert rec["code_hash"] == artifacts.code_hash(longrun.MODULES + [longrun.MODEL_MODULES["smollm2"]])
        assert rec["params_hash"] == lu.params_hash(longrun.check_run(RUN))
    prov = json.loads((path / "provenance.json").read_text())
    assert prov["modules"] == sorted(longrun.MODULES + ["analysis.qevict.gguf_model"])
    assert prov["command"].startswith("python -m analysis.qevict.longrun_units ")
    assert prov["units"]["computed"] == RUN["documents"] and prov["units"]["reused"] == []
    assert set(prov["tables"]) == {"summary", "timings", "drift", "drift_ends"}
    assert any("2/2 done, 0 remaining; elapsed" in line for line in lines)  # progress: done, left, elapsed
    summary = pd.read_csv(path / "summary.csv")
    assert list(summary.document.unique()) == RUN["documents"]  # the run's document order


def test_interrupted_run_resumes_to_the_same_artifact(uninterrupted, tmp_path, monkeypatch):
    """Interrupted (Ctrl-C) right after its first unit is written, then resumed: the first unit is
    kept, only the second computed, and every table but timings is the same bytes."""
    results = tmp_path / "results"

    def ctrl_c_after_first_unit(line):
        if " done in " in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(results, monkeypatch, say=ctrl_c_after_first_unit)
    assert len(list((results / "tiny_long.units").glob("*.unit.pkl"))) == 1
    assert not (results / "tiny_long").exists()
    path, lines = _run(results, monkeypatch)
    assert any("1 kept" in line and "1 to compute" in line for line in lines), lines
    prov = json.loads((path / "provenance.json").read_text())
    assert len(prov["units"]["reused"]) == 1 and len(prov["units"]["computed"]) == 1
    described = artifacts.read_artifact("tiny_long").describe()
    assert "(1 of 2 units computed by an earlier invocation; " in described
    whole = _shas(uninterrupted[1])
    assert {t: _shas(path)[t] for t in EXACT} == {t: whole[t] for t in EXACT}
    a, b = pd.read_csv(path / "timings.csv"), pd.read_csv(uninterrupted[1] / "timings.csv")
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    assert a[["model", "document", "streams"]].equals(b[["model", "document", "streams"]])
    # nothing left to do: a rerun keeps both units and writes the same tables again
    path, lines = _run(results, monkeypatch)
    assert any("2 kept" in line and "0 to compute" in line for line in lines), lines
    assert _shas(path) == {**_shas(path), **{t: whole[t] for t in EXACT}}


# longrun.execute(jobs=2) forks its workers (as `longrun --jobs 2` computed the committed artifacts): in a
# fresh process, since forking one that has run numba's OpenMP kernels is unsafe
EQUIVALENCE = """
import json, os, sys
from analysis import artifacts
from analysis.qevict import longrun, longrun_units as lu
from tests._tiny_model import longrun_loader
run = json.loads(sys.argv[1])
os.environ["KVBOOK_RESULTS"] = sys.argv[2]
longrun.load = longrun_loader
tables = longrun.execute(run, verbose=False, jobs=2)
mods = lu.modules(longrun.check_run(run))
artifacts.write_artifact("ref", tables, modules=mods, command="c", wall_seconds=1)
lu.run_entry(run, loader=sys.argv[3], jobs=2, say=print)
"""


@pytest.mark.slow
def test_units_equal_longrun_execute_over_all_documents(tmp_path):
    """The units (computed in two spawned processes) concatenated are longrun.execute's tables over all
    documents at once (dtypes, row order, index): the same table hashes, the frozen settings table too."""
    import subprocess
    import sys

    run = {k: v for k, v in RUN.items() if k != "tuned_settings"}  # chapter 4's frozen settings
    cmd = [sys.executable, "-W", "ignore", "-c", EQUIVALENCE, json.dumps(run), str(tmp_path), LOADER]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=artifacts.REPO_ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    ref, units = _shas(tmp_path / "ref"), _shas(tmp_path / "tiny_long")
    assert set(ref) == set(units) and "settings" in ref
    assert {t: ref[t] for t in ref if t != "timings"} == {t: units[t] for t in ref if t != "timings"}
    a, b = pd.read_csv(tmp_path / "ref" / "timings.csv"), pd.read_csv(tmp_path / "tiny_long" / "timings.csv")
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    assert a[["model", "document"]].equals(b[["model", "document"]])
    prov = json.loads((tmp_path / "tiny_long" / "provenance.json").read_text())
    assert prov["command"].endswith("--only tiny_long --jobs 2")


def test_settings_table_is_taken_once_and_must_agree():
    def rec(doc, x, setting):
        return dict(document=doc, tables=dict(summary=pd.DataFrame(dict(document=[doc], x=[x])),
                                              settings=pd.DataFrame(dict(policy=["qevict"], k=[setting]))))

    r = dict(name="t", documents=["b", "a"])
    t = lu.assemble(r, {"a": rec("a", 1.0, 3), "b": rec("b", 2.0, 3)})
    assert list(t["summary"].document) == ["b", "a"] and list(t["summary"].index) == [0, 1]
    assert t["settings"].equals(pd.DataFrame(dict(policy=["qevict"], k=[3])))
    with pytest.raises(lu.LongRunError, match="disagree on the settings"):
        lu.assemble(r, {"a": rec("a", 1.0, 3), "b": rec("b", 2.0, 4)})


def _copy(uninterrupted, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(uninterrupted[0], results)
    return results, results / "tiny_long.units"


def test_stale_and_unreadable_units_are_recomputed_and_named(uninterrupted, tmp_path, monkeypatch):
    results, folder = _copy(uninterrupted, tmp_path)
    needle, code = (lu.unit_path(folder, d) for d in RUN["documents"])
    rec = pickle.loads(code.read_bytes())
    rec["code_hash"] = "0" * 64  # computed by other code
    code.write_bytes(pickle.dumps(rec))
    (folder / ".x.unit.pkl.abc.tmp").write_bytes(b"half")  # an atomic write cut short
    path, lines = _run(results, monkeypatch)
    assert any("recomputing stale unit code:argparse: code changed (computed with 0000000000" in line
               for line in lines), lines
    assert any("half-written" in line and ".x.unit.pkl.abc.tmp" in line for line in lines)
    assert not list(folder.glob("*.tmp"))
    prov = json.loads((path / "provenance.json").read_text())
    assert prov["units"] == dict(prov["units"], computed=["code:argparse"], reused=["needle:turtle"])
    assert pickle.loads(code.read_bytes())["code_hash"] != "0" * 64
    assert {t: _shas(path)[t] for t in EXACT} == {t: _shas(uninterrupted[1])[t] for t in EXACT}
    needle.write_bytes(b"not a pickle")
    path, lines = _run(results, monkeypatch)
    assert any("recomputing stale unit needle:turtle: unreadable" in line for line in lines), lines
    assert {t: _shas(path)[t] for t in EXACT} == {t: _shas(uninterrupted[1])[t] for t in EXACT}


def test_units_of_other_parameters_are_refused_until_fresh(uninterrupted, tmp_path, monkeypatch):
    results, folder = _copy(uninterrupted, tmp_path)
    other = dict(RUN, lir_gap_steps=16, documents=["code:argparse"])
    with pytest.raises(lu.LongRunError, match=r"other parameters.*lir_gap_steps: 8 -> 16.*--fresh"):
        _run(results, monkeypatch, run=other)
    path, lines = _run(results, monkeypatch, run=other, fresh=True)
    assert any("--fresh: removed" in line for line in lines)
    assert json.loads((path / "provenance.json").read_text())["params"]["lir_gap_steps"] == 16
    assert len(list(folder.glob("*.unit.pkl"))) == 1


def test_bad_input_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump({"runs": [RUN]}))
    assert lu.main([str(cfg), "--only", "nope"]) == 1
    err = capsys.readouterr().err
    assert "unknown run(s) ['nope']" in err and "runs: ['tiny_long']" in err
    assert lu.main([str(tmp_path / "missing.yaml")]) == 1
    assert "give a YAML file with a list 'runs'" in capsys.readouterr().err
    with pytest.raises(lu.LongRunError, match="listed twice"):
        lu.run_entry(dict(RUN, documents=["code:argparse", "code:argparse"]), loader=LOADER)
    with pytest.raises(lu.LongRunError, match="not found.*module:function"):
        lu.run_entry(RUN, loader="tests._tiny_model:nope", say=lambda line: None)
    assert lu.main([str(cfg), "--jobs", "0"]) == 2
    monkeypatch.delenv("KVBOOK_RESULTS")  # a tiny model's numbers never land in the repository's results/
    with pytest.raises(lu.LongRunError, match="set KVBOOK_RESULTS to another folder"):
        lu.run_entry(RUN, loader=LOADER, say=lambda line: None)


def test_unit_files_are_named_by_document_and_never_collide(tmp_path):
    docs = ["code:a+b", "code:a_b", "docs:" + "x" * 200]
    paths = [lu.unit_path(tmp_path, d) for d in docs]
    assert len(set(paths)) == 3 and all(len(p.name) < 80 for p in paths)
    assert paths[0].name.startswith("code_a_b.")
    assert hashlib.sha256(b"code:a+b").hexdigest()[:10] in paths[0].name


def test_progress_counts_current_units_and_names_stale_ones(uninterrupted, tmp_path, monkeypatch):
    """``progress`` (what the chapter shows of a regeneration in progress) counts the units current for
    this code, names the stale ones, reports units of other parameters, and changes nothing on disk."""
    results, folder = _copy(uninterrupted, tmp_path)
    monkeypatch.setenv("KVBOOK_RESULTS", str(results))
    before = sorted((f.name, f.read_bytes()) for f in folder.iterdir())
    assert lu.progress(RUN) == dict(done=2, stale={}, total=2, problem=None)
    assert sorted((f.name, f.read_bytes()) for f in folder.iterdir()) == before  # nothing written or removed
    code = lu.unit_path(folder, "code:argparse")
    rec = pickle.loads(code.read_bytes())
    code.write_bytes(pickle.dumps(dict(rec, code_hash="0" * 64)))
    p = lu.progress(RUN)
    assert p["done"] == 1 and list(p["stale"]) == ["code:argparse"]
    assert "code changed" in p["stale"]["code:argparse"]
    assert lu.progress(dict(RUN, documents=RUN["documents"] + ["code:shutil"]))["total"] == 3
    assert "other parameters" in lu.progress(dict(RUN, lir_gap_steps=16))["problem"]
    shutil.rmtree(folder)
    assert lu.progress(RUN) == dict(done=0, stale={}, total=2, problem=None)


def test_chapter_names_each_stale_run_with_its_regeneration_progress(uninterrupted, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from analysis.qevict.chapter import stale_text

    results, folder = _copy(uninterrupted, tmp_path)
    monkeypatch.setenv("KVBOOK_RESULTS", str(results))
    sweep = tmp_path / "sweep.yaml"
    other = dict(RUN, name="tiny_other")
    sweep.write_text(yaml.safe_dump(dict(runs=[RUN, other], regenerating=dict(
        since="2026-12-03", reason="cleaned code", runs=["tiny_long"]))))
    arts = [SimpleNamespace(name="tiny_long", stale=True), SimpleNamespace(name="tiny_other", stale=True)]
    assert stale_text(arts, sweep) == ("tiny_other; being regenerated since 2026-12-03 (documents computed "
                                       "on the current code: tiny_long 2 of 2)")
    assert stale_text([SimpleNamespace(name="tiny_long", stale=False)], sweep) == "none"


def test_settings_file_is_found_from_any_working_directory(tmp_path, monkeypatch):
    """A run names its tuned settings from the repository root; a page executes in book/."""
    monkeypatch.chdir(tmp_path)
    r = longrun.check_run(dict(RUN, tuned_settings="results/qevict_tuned.json"))
    tuned = (artifacts.REPO_ROOT / "results/qevict_tuned.json").read_bytes()
    assert lu.settings_sha(r) == hashlib.sha256(tuned).hexdigest()
