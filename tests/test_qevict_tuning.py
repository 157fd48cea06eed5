"""Issue 14: genres, the settings search's candidates and frozen file, disjoint tuning documents,
and the three-tier allocation approaching the full cache as the budget grows."""
import dataclasses
import json

import numpy as np
import pytest

from analysis.qevict import corpora, tuning
from analysis.qevict.kvcache import EVICTED, FULL, QUANT
from analysis.qevict.policies import PolicyConfig, make_policy


def test_candidates_seeded_and_start_with_defaults():
    d = PolicyConfig()
    a = tuning.candidates("qevict_recall", 6, 0, d)
    assert a == tuning.candidates("qevict_recall", 6, 0, d)
    assert a != tuning.candidates("qevict_recall", 6, 1, d)
    assert a[0] == dict(full_share=d.full_share, qbits=d.qbits, score_decay=d.score_decay,
                        promote_margin=d.promote_margin)
    assert len({json.dumps(c, sort_keys=True) for c in a}) == 6
    m = tuning.candidates("mikv", 6, 0, d)
    assert len(m) == len(a) and all(set(c) == {"full_share", "qbits", "score_decay"} for c in m)
    for c in a:
        for k, v in c.items():
            assert v in tuning.SEARCH_SPACE[k]


def test_overrides_from_frozen_settings(tmp_path):
    tuned = dict(settings={"qevict_recall": {"0.2": dict(full_share=0.25, qbits=4, score_decay=0.8,
                                                          promote_margin=1.0)},
                           "mikv": {"0.2": dict(full_share=0.75, qbits=3, score_decay=0.99)}})
    base = PolicyConfig()
    o = tuning.overrides(tuned, base, ["h2o", "mikv", "qevict_recall", "qevict_dequant"], [0.2])
    assert set(o) == {("mikv", 0.2), ("qevict_recall", 0.2), ("qevict_dequant", 0.2)}
    assert o[("qevict_dequant", 0.2)] == o[("qevict_recall", 0.2)]
    assert o[("qevict_recall", 0.2)] == dataclasses.replace(base, full_share=0.25, qbits=4, score_decay=0.8,
                                                            promote_margin=1.0)
    assert o[("mikv", 0.2)].promote_margin == base.promote_margin
    with pytest.raises(ValueError, match="not tuned"):
        tuning.overrides(tuned, base, ["mikv"], [0.2, 0.5])
    p = tuning.write(dict(tuned, x=1), tmp_path / "t.json", "cmd")
    back = tuning.load(p)
    assert back["settings"] == tuned["settings"] and back["provenance"]["command"] == "cmd"
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(FileNotFoundError, match="python -m analysis.qevict.tuning"):
        tuning.load(tmp_path / "missing.json")


def test_check_disjoint():
    a = np.arange(100)
    tuning.check_disjoint({"t": a}, {"e": np.arange(200, 300)}, k=8)
    with pytest.raises(ValueError, match="'e'.*'t'"):
        tuning.check_disjoint({"t": a}, {"e": np.r_[np.arange(500, 520), a[40:48], np.arange(600, 620)]}, k=8)


def test_genres_registered():
    assert len(corpora.GENRES) >= 5
    assert {"code", "docs", "needle"} <= set(corpora.GENRES)
    text, src = corpora.reference_text("assignment")
    assert "assignment" in text[:2000].lower() and len(text) > 50_000
    with pytest.raises(ValueError, match="topic"):
        corpora.reference_text("no-such-topic")
    with pytest.raises(ValueError):
        corpora.news_text("README")
    with pytest.raises(ValueError):
        corpora.parse_spec("poem:x")


def _target_fracs(policy, fracs, nc=40, L=2, H=2, seed=0):
    rng = np.random.default_rng(seed)
    cfg = PolicyConfig(window=32, qbits=2)
    out = []
    for f in fracs:
        p = make_policy(policy, f, cfg, L, H, nc + 1)
        obs = rng.random((L, H, nc + 1))
        p.init(dict(obs=obs, colsum=obs, snap=obs, last=obs))
        t = p.target(np.zeros((L, H, nc + 1), np.int8), nc)[..., :nc]
        out.append(((t == FULL).mean(), (t == QUANT).mean(), (t == EVICTED).mean()))
    return np.array(out)


@pytest.mark.parametrize("policy", ["mikv", "qevict_recall"])
def test_three_tier_approaches_full_cache(policy):
    fr = _target_fracs(policy, [0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.0])
    assert np.all(np.diff(fr[:, 0]) >= -1e-12)  # more full-precision windows as the budget grows
    assert np.all(np.diff(fr[:, 2]) <= 1e-12)  # fewer evicted
    assert fr[-1, 0] == 1.0


def test_frozen_settings_match_the_code():
    """results/qevict_tuned.json is current: rerun `python -m analysis.qevict.tuning` when this fails
    (the policies, quantizer, documents, search space or tuning documents changed since the search)."""
    tuned = tuning.load()
    reasons = tuning.stale_reasons(tuned)
    assert not reasons, f"stale tuned settings: {reasons}"
    assert set(tuned["settings"]) == set(tuning.TUNED_KNOBS)
    assert all(len(v) == len(tuned["budgets"]) for v in tuned["settings"].values())


def test_stale_reasons_detects_changes():
    tuned = json.loads(json.dumps(tuning.load()))
    tuned["search_space"] = {"qbits": [2]}
    tuned["tuning_documents"] = ["code:x"]
    r = tuning.stale_reasons(tuned)
    assert "the search space changed" in r and "the tuning documents changed" in r


def test_stale_reasons_key_on_the_inputs_of_the_settings(monkeypatch):
    """The settings are stale when policies.py/quant.py hash differently from the recorded code hash or
    a tuning document's tokens differ from the recorded sha256 (not when corpora.py merely gains
    documents); settings without recorded inputs fall back to git diff of the three files."""
    real = tuning.document_hashes
    memo = {}

    def once(docs, P, D):  # the real tokenization, once per input: stale_reasons asks for it at every call
        k = (tuple(docs), P, D)
        if k not in memo:
            memo[k] = real(docs, P, D)
        return dict(memo[k])

    monkeypatch.setattr(tuning, "document_hashes", once)
    tuned = json.loads(json.dumps(tuning.load()))
    assert set(tuned["inputs"]["modules"]) >= set(tuning.DEPENDS_ON_MODULES)
    assert set(tuned["inputs"]["documents"]) == set(tuned["tuning_documents"])
    t = json.loads(json.dumps(tuned))
    t["inputs"]["code_hash"] = "0" * 64
    assert any("code hash" in r for r in tuning.stale_reasons(t))
    t = json.loads(json.dumps(tuned))
    spec = tuned["tuning_documents"][1]
    t["inputs"]["documents"][spec] = "0" * 64
    assert tuning.stale_reasons(t) == [f"tuning document {spec} has other tokens than those searched on"]
    # the tokens of a document change (e.g. corpora.py or the tokenizer changed how it is built)
    monkeypatch.setattr(tuning, "document_hashes",
                        lambda docs, P, D: {**once(docs, P, D), spec: "changed"})
    assert tuning.stale_reasons(tuned) == [f"tuning document {spec} has other tokens than those searched on"]
    monkeypatch.setattr(tuning, "document_hashes", once)
    t = json.loads(json.dumps(tuned))
    t["inputs"]["modules"] = ["analysis.qevict.quant"]
    assert any("do not cover analysis.qevict.policies" in r for r in tuning.stale_reasons(t))
