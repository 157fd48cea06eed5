"""Chapter 4's default run as a committed artifact: read back unchanged, used only where it stands for the
run asked for (parameters, code, model, frozen settings, declared sensitivity ends), computed otherwise."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from analysis import artifacts
from analysis.qevict import defaultrun as DR
from analysis.qevict.params import SCHEMA


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_RESULTS", str(tmp_path / "results"))
    return tmp_path


def _config(**over):
    v = SCHEMA.defaults()
    v.update(over)
    return SCHEMA.config(SCHEMA.validate(v))


def _run(c, seed=0):
    """A run with tables of the real run's kinds (strings, floats, ints, booleans, NaN)."""
    rng = np.random.default_rng(seed)
    docs = list(c.workload.documents)
    two = np.repeat(docs, 2)
    summary = pd.DataFrame(dict(document=two, genre=[d.split(":")[0] for d in two],
                                policy=["full", "qevict_recall"] * len(docs), budget=[1.0, 0.2] * len(docs),
                                kl=rng.random(len(two)), fits=[True, False] * len(docs),
                                promotions=rng.integers(0, 9, len(two)),
                                label=["Full", "QEvict, recall"] * len(docs)))
    summary.loc[0, "kl"] = np.nan
    drift = pd.DataFrame(dict(document=docs, model="smollm2", miss_rel_excess=rng.normal(size=len(docs))))
    ends = pd.concat([pd.DataFrame(dict(end=n, value=float(v), document=docs, model="smollm2",
                                        miss_observed=rng.random(len(docs))))
                      for n, v in DR.attention_ends()], ignore_index=True)
    lir = pd.DataFrame(dict(document=docs, layer=0, lir=rng.random(len(docs))))
    return DR.DefaultRun(c, summary, lir, drift,
                         pd.DataFrame(dict(layer=[0, 1], lir_b=rng.random(2))), ends,
                         dict(right=10.5, wrong=580.25, tokens=1024, module="argparse"), None)


def _computed(monkeypatch):
    calls = []

    def compute(c, verbose=False):
        calls.append(c)
        return _run(c, seed=1)
    monkeypatch.setattr(DR, "compute", compute)
    return calls


def test_artifact_reads_back_what_was_computed(tmp_results, monkeypatch):
    c = _config()
    run = _run(c)
    DR.write(run, wall_seconds=480.0)
    calls = _computed(monkeypatch)
    back = DR.default_run(c)
    assert back.from_artifact and not calls and "make default-run" in back.source
    for t in ("summary", "lir", "drift", "budget_lir", "ends"):
        pd.testing.assert_frame_equal(getattr(back, t), getattr(run, t), check_exact=True)
    assert back.layout == run.layout and back.provenance["wall_seconds"] == 480.0
    assert back.tuned is not None  # the chapter's frozen settings, read again from their file
    n, v = DR.attention_ends()[0]
    pd.testing.assert_frame_equal(back.at(n, v), run.at(n, v))


def test_other_parameters_are_computed_and_say_why(tmp_results, monkeypatch):
    DR.write(_run(_config()), wall_seconds=1.0)
    calls = _computed(monkeypatch)
    c = _config(decode_tokens=32)
    out = DR.default_run(c)
    assert calls == [c] and not out.from_artifact
    assert out.source.startswith("computed now") and "other parameters" in out.source


def test_no_artifact_and_stale_artifact_are_computed(tmp_results, monkeypatch):
    calls = _computed(monkeypatch)
    c = _config()
    assert "no committed default run" in DR.default_run(c).source and len(calls) == 1
    DR.write(_run(c), wall_seconds=1.0)
    prov = tmp_results / "results" / DR.NAME / "provenance.json"
    prov.write_text(prov.read_text().replace('"code_hash": "', '"code_hash": "0'))
    out = DR.default_run(c)
    assert len(calls) == 2 and "stale" in out.source and "make default-run" in out.source


def test_a_new_sensitivity_end_needs_the_attention(tmp_results, monkeypatch):
    c = _config()
    run = _run(c)
    DR.write(run, wall_seconds=1.0)
    more = DR.attention_ends() + [("shuffle block (steps)", 32.0)]
    monkeypatch.setattr(DR, "attention_ends", lambda claim_id=DR.DRIFT_CLAIM: more)
    calls = _computed(monkeypatch)
    out = DR.default_run(c)
    assert calls and "other declared sensitivity ends" in out.source
    with pytest.raises(KeyError, match="make default-run"):
        run.at("shuffle block (steps)", 32)
    with pytest.raises(KeyError, match="not an attention-dependent"):
        run.at("alpha", 0.01)


def test_attention_ends_are_the_declared_ones():
    ends = DR.attention_ends()
    assert ("top share of windows", 0.1) in ends and ("shuffle block (steps)", 16.0) in ends
    assert all(n in DR.ATTENTION_ENDS for n, _ in ends)


def test_key_covers_every_parameter():
    c = _config()
    k = DR.key(c)
    flat = {f.name for grp in dataclasses.fields(c) for f in dataclasses.fields(getattr(c, grp.name))}
    assert flat == {n for grp in k["params"].values() for n in grp} == set(SCHEMA.defaults())
    assert len(k["model_sha256"]) == 64 and len(k["tuned_sha256"]) == 64


def test_written_artifact_is_atomic_and_has_provenance(tmp_results):
    p = DR.write(_run(_config()), wall_seconds=2.0)
    a = artifacts.read_artifact(DR.NAME)
    assert p.name == DR.NAME and not a.stale and set(a.tables) == set(DR.TABLES)
    assert a.provenance["command"] == DR.COMMAND and a.provenance["modules"] == DR.MODULES
