"""What `make long` stores besides the summary: the drift tables the ledger's drift row is judged on
(at the rule and at its attention-dependent sensitivity ends), and the frozen settings with their
disjointness check, both before any decoding."""
from types import SimpleNamespace

import numpy as np
import pytest

from analysis.claims import rule
from analysis.qevict import longrun
from analysis.qevict.metrics import document_drift
from analysis.qevict.verdicts import drift_excess


def _run(**kw):
    return longrun.check_run(dict(name="t", model="smollm2", documents=["code:argparse"], prefill_tokens=256,
                                  decode_tokens=64, **kw))


def test_drift_tables_hold_the_rule_and_its_declared_ends():
    r = _run()
    P, W = r["prefill_tokens"], r["window_tokens"]
    rng = np.random.default_rng(0)
    a = rng.dirichlet(np.ones((P + 64) // W), size=(48, 2, 3)).astype(np.float32)  # (D, L, Hkv, NW)
    a[:, :, :, P // W:] = 0
    row, ends = longrun.drift_tables(a, SimpleNamespace(spec="code:x", kind="code"), r)
    ref = document_drift(a, P, W, gap=r["lir_gap_steps"], tau=r["lir_tau"], sink_windows=r["sink_windows"],
                         seed=r["seed"])
    assert row["miss_rel_excess"] == ref["miss_rel_excess"] and row["genre"] == "code"
    declared = [(s["name"], e, s[e]) for s in rule("ch4_drift")["sensitivity"]
                if s["name"] in longrun.DRIFT_ENDS for e in ("low", "high")]
    assert [(e["sensitivity"], e["end"], e["value"]) for e in ends] == declared and len(declared) == 4
    for e in ends:
        v = e["value"] if "share" in e["sensitivity"] else int(e["value"])
        kw = {longrun.DRIFT_ENDS[e["sensitivity"]]: v}
        got = drift_excess(a, P, W, r["sink_windows"], seed=r["seed"], **kw)
        assert e["rel_excess"] == pytest.approx(got)


def test_frozen_settings_off_and_overlap_rejected_before_any_run():
    from analysis.qevict import tuning
    from analysis.qevict.corpora import load_document
    from analysis.qevict.experiment import policy_config
    from analysis.qevict.tokenizer import load_tokenizer

    tok = load_tokenizer()
    r = _run(tuned_settings="none")
    assert longrun.frozen_settings(r, tok, None, []) == (None, None)
    r = _run()  # the default: chapter 4's frozen settings
    p = dict(r, head_dim=64)
    tuned = tuning.load(r["tuned_settings"])
    spec = tuned["tuning_documents"][0]  # a tuning document used for evaluation must be refused
    doc = load_document(spec, tok, 321, prefill_tokens=256)
    with pytest.raises(ValueError, match="shares 32-token runs"):
        longrun.frozen_settings(r, tok, policy_config(p), [doc])
    other = load_document("ref:assert", tok, 321, prefill_tokens=256)
    over, table = longrun.frozen_settings(r, tok, policy_config(p), [other])
    assert set(table.policy) == {pol for pol, _ in over} and len(table) == len(over)
    assert table.tuned_sha256.nunique() == 1
    # a policy that takes another's settings shows that policy's knobs, equal to its source's
    for pol, src in tuning.SHARES_SETTINGS.items():
        if pol not in set(table.policy):
            continue
        knobs = tuned["tuned_knobs"][src]
        a = table[table.policy == pol].set_index("budget")[knobs]
        b = table[table.policy == src].set_index("budget")[knobs]
        assert a.notna().all().all() and a.equals(b)
        assert (table[table.policy == pol].settings_of == src).all()
