"""Committed long-run artifacts: provenance, stale detection, atomic writes; the committed ones are fresh."""
import json
import sys

import pandas as pd
import pytest

from analysis import artifacts


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "kvbook_tmp_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(mod))
    return tmp_path


def test_round_trip_and_provenance(tmp_results):
    df = pd.DataFrame(dict(a=[1, 2], b=[0.5, 0.25]))
    p = artifacts.write_artifact("demo", {"t": df}, modules=["kvbook_tmp_mod"], command="make demo",
                                 wall_seconds=12.3, params=dict(n=1))
    assert p.name == "demo" and not (p.parent / "demo.partial").exists()
    a = artifacts.read_artifact("demo")
    pd.testing.assert_frame_equal(a.tables["t"], df)
    prov = a.provenance
    for k in ("commit", "code_hash", "date", "machine", "command", "wall_seconds", "modules"):
        assert k in prov
    assert prov["command"] == "make demo" and prov["machine"]["cores"] >= 1
    assert not a.stale and "make demo" in a.describe() and "STALE" not in a.describe()


def test_stale_when_code_changes(tmp_results):
    artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1]))}, modules=["kvbook_tmp_mod"],
                             command="c", wall_seconds=1)
    (tmp_results / "mods" / "kvbook_tmp_mod.py").write_text("X = 2\n")
    a = artifacts.read_artifact("demo")
    assert a.stale and "code it depends on has changed" in a.stale_reasons[0]
    assert a.describe().startswith("**STALE**")


def test_stale_when_table_edited(tmp_results):
    p = artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1]))}, modules=["kvbook_tmp_mod"],
                                 command="c", wall_seconds=1)
    (p / "t.csv").write_text("a\n2\n")
    assert any("edited" in r for r in artifacts.read_artifact("demo").stale_reasons)


def test_failed_write_leaves_nothing(tmp_results, monkeypatch):
    monkeypatch.setattr(artifacts, "code_hash", lambda m: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1]))}, modules=["x"], command="c",
                                 wall_seconds=1)
    assert not list((tmp_results / "results").glob("demo*"))


def test_missing_artifact_says_how_to_make_it(tmp_results):
    with pytest.raises(FileNotFoundError, match="make long"):
        artifacts.read_artifact("nope")


def test_code_hash_order_independent_and_sensitive():
    h1 = artifacts.code_hash(["analysis.kv", "analysis.roofline"])
    assert h1 == artifacts.code_hash(["analysis.roofline", "analysis.kv"])
    assert h1 != artifacts.code_hash(["analysis.kv"])


@pytest.mark.parametrize("name", artifacts.list_artifacts() or ["(none)"])
def test_committed_artifacts_are_not_stale(name):
    """A committed artifact whose code has changed since it was computed must be recomputed
    (`make long`) before it can be shown as current."""
    if name == "(none)":
        pytest.skip("no committed artifacts")
    a = artifacts.read_artifact(name)
    assert not a.stale, f"results/{name} is stale: {a.stale_reasons}; rerun `{a.provenance['command']}`"
    json.dumps(a.provenance)
    assert sys.version_info >= (3, 9)
