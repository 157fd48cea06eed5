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


def test_the_dirty_flag_says_which_files_and_whether_they_were_its_code(tmp_results):
    """A tree with uncommitted changes under analysis/: the line names the files and says whether any is
    the artifact's code; an older provenance without the list says 'none in its code' only while its
    code hash still matches (not stale)."""
    artifacts.write_artifact("demo", {"t": pd.DataFrame(dict(a=[1]))}, modules=["analysis.kv"],
                             command="c", wall_seconds=1)
    path = artifacts.results_dir() / "demo" / "provenance.json"
    prov = json.loads(path.read_text())
    assert isinstance(prov["dirty_files"], list)

    def line(**kw):
        path.write_text(json.dumps({**prov, **kw}))
        return artifacts.read_artifact("demo").describe()

    assert "uncommitted" not in line(dirty=False, dirty_files=[])
    assert "(uncommitted changes in analysis/kv.py)" in line(dirty=True, dirty_files=["analysis/kv.py"])
    other = line(dirty=True, dirty_files=["analysis/disagg/chapter.py"])
    assert "(uncommitted changes in analysis/disagg/chapter.py; none in its code)" in other
    assert "(uncommitted changes; none in its code)" in line(dirty=True, dirty_files=None)
    assert "(uncommitted changes)" in line(dirty=True, dirty_files=None, code_hash="0")  # stale: unknown


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


def _regenerating():
    from analysis.qevict.longrun_units import regenerating

    return regenerating()


@pytest.mark.parametrize("name", artifacts.list_artifacts() or ["(none)"])
def test_committed_artifacts_are_not_stale(name):
    """A committed artifact whose code has changed since it was computed must be recomputed
    (`make long`) before it can be shown as current. The one exception: a long run that the sweep
    declares as being regenerated (``regenerating`` in sweeps/qevict_long.yaml), unit by unit across
    machines; the book then marks it stale with its progress and judges nothing on it."""
    if name == "(none)":
        pytest.skip("no committed artifacts")
    a = artifacts.read_artifact(name)
    if a.stale and name in _regenerating()["runs"]:
        return
    assert not a.stale, f"results/{name} is stale: {a.stale_reasons}; rerun `{a.provenance['command']}`"
    json.dumps(a.provenance)
    assert sys.version_info >= (3, 9)


def test_a_declared_regeneration_is_real_and_its_committed_units_are_current():
    """Every run declared as regenerating is stale or missing (a finished one leaves the declaration),
    and every unit committed for it was computed on the current code, parameters and settings: a stale
    or foreign unit in results/ would be recomputed anyway, so committing it is an error."""
    from analysis.qevict import longrun_units as lu

    reg = _regenerating()
    have = set(artifacts.list_artifacts())
    status = lu.regeneration_status()
    for n in reg["runs"]:
        if n in have:
            assert artifacts.read_artifact(n).stale, (
                f"results/{n} is current: remove it from 'regenerating' in sweeps/qevict_long.yaml")
        p = status[n]
        assert p["problem"] is None and not p["stale"], (n, p)
    # units committed for a run not being regenerated are leftovers
    declared = set(reg["runs"])
    for folder in sorted(artifacts.results_dir().glob("*.units")):
        name = folder.name[: -len(".units")]
        assert name in declared, f"{folder} holds units of {name}, which is not being regenerated; remove it"


def test_regeneration_declaration_is_checked(tmp_path):
    from analysis.qevict import longrun_units as lu

    sweep = tmp_path / "s.yaml"
    sweep.write_text("runs:\n  - {name: a}\nregenerating: {since: 2026-12-03, reason: r, runs: [b]}\n")
    with pytest.raises(lu.LongRunError, match="does not declare"):
        lu.regenerating(sweep)
    sweep.write_text("runs:\n  - {name: a}\nregenerating: {runs: [a]}\n")
    with pytest.raises(lu.LongRunError, match="'since'"):
        lu.regenerating(sweep)
    sweep.write_text("runs:\n  - {name: a}\n")
    assert lu.regenerating(sweep)["runs"] == []
