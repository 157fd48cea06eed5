"""References tied to their setting (issue 28, item 4): every published figure names the setting it
belongs to (data/published.csv `setting`), every keyed reference of data/claims.yaml points at a figure
of that setting, and a rerun in another setting says "no published figure for this setting" (through
analysis.claims.evaluate and through the chapter functions that build the verdicts)."""
import numpy as np
import pandas as pd
import pytest

from analysis import claims, data

SETTING_KEYS = {"trace", "model", "hardware", "context"}
# claim setting key -> published setting key
SAME_AS = {"trace": "trace", "context_tokens": "context", "model": "model", "gpu": "hardware"}


def _settings():
    df = data.table("published.csv")
    return {k: parse(s) for k, s in zip(df["key"], df["setting"])}


def parse(text) -> dict:
    """'trace=a|b; model=m' -> {'trace': ['a', 'b'], 'model': ['m']}; a value's note in parentheses is
    dropped ('a|b (note)' -> ['a', 'b'])."""
    out = {}
    for part in str(text).split("; "):
        k, sep, v = part.partition("=")
        assert sep and k.strip() and v.strip(), f"not key=value: {part!r} in {text!r}"
        out[k.strip()] = [x.strip() for x in v.split(" (")[0].split("|")]
    return out


def test_every_published_figure_names_its_setting():
    df = data.table("published.csv")
    assert "setting" in df.columns, "data/published.csv has no 'setting' column"
    for key, text in zip(df["key"], df["setting"]):
        assert isinstance(text, str) and text.strip(), f"{key} names no setting"
        assert SETTING_KEYS & set(parse(text)), f"{key}: its setting names none of {sorted(SETTING_KEYS)}"


def test_the_check_fails_on_a_row_without_a_setting():
    with pytest.raises(AssertionError):
        parse("conversation trace")
    assert not SETTING_KEYS & set(parse("dtype=bf16"))


def test_keyed_references_point_at_a_figure_of_that_setting():
    settings = _settings()
    claims._load.cache_clear()
    n = 0
    for cid, c in claims.table().items():
        for comp in c.get("components") or [c]:
            ref = comp.get("reference") or {}
            for val, key in (ref.get("keys") or {}).items():
                assert str(val) in settings[key][SAME_AS[ref["by"]]], (cid, val, key)
                n += 1
            for k, want in (ref.get("setting") or {}).items():
                if "published" in ref and k in SAME_AS:
                    assert str(want) in settings[ref["published"]][SAME_AS[k]], (cid, k, want)
                    n += 1
    assert n >= 10


@pytest.mark.parametrize("cid, setting", [
    ("ch2_table2_cache_ratio", {"trace": "my_trace.jsonl"}),
    ("ch2_fig9_saturation", {"trace": "my_trace.jsonl"}),
    ("ch2_fig9_local_dram", {"trace": None}),
    ("ch5_kimi_decode", {"context_tokens": 131072}),
    ("ch5_tiering_share", {"grid": "contexts 4096; hit rates 0.6; SSD price factors 1"}),
    ("ch5_disagg_share", {"grid": "contexts 4096; hit rates 0.6; SSD price factors 1"}),
])
def test_another_setting_has_no_published_figure(cid, setting):
    claims._load.cache_clear()
    x = {"hit-rate ratio": 1.0} if claims.rule(cid).get("components") else 0.5
    v = claims.evaluate(cid, x, setting=setting)
    assert v.verdict == claims.NOT_TESTABLE and "no published figure" in v.label, v.label
    # in the declared setting the same value is judged (not "not testable")
    declared = {k: (w if not isinstance(w, dict) else next(iter(w)))
                for k, w in _declared_setting(cid).items()}
    assert claims.evaluate(cid, x, setting=declared).verdict != claims.NOT_TESTABLE


def _declared_setting(cid):
    ref = claims.rule(cid)["reference"]
    if "by" in ref:
        return {ref["by"]: ref["keys"]}
    return dict(ref["setting"])


def test_chapter2_on_another_trace_says_no_published_figure():
    from analysis.tiering import chapter as C
    from analysis.tiering import from_requests, lru_hit_curve
    reqs = [{"timestamp": t * 1000, "input_length": 512 * len(b), "output_length": 1, "hash_ids": b}
            for t, b in enumerate([[1, 2], [1, 2, 3], [1, 2, 3], [4, 5]])]
    tr = from_requests(reqs)
    hc = lru_hit_curve(tr)
    h = {"local_dram": 3e6, "sat_pub": 5e7, "sat99": hc.capacity_for_fraction(0.99) * tr.block_size,
         "hbm_tok": 1e6, "policies": pd.DataFrame({"policy": []})}
    for trace, testable in ((None, False), ("mooncake_synthetic", True)):
        s = C.saturation(tr, hc, h, trace)
        for v in (s["fig9"], s["fig9_3m"]):
            assert (v.verdict != claims.NOT_TESTABLE) == testable, (trace, v.label)
            if not testable:
                assert "no published figure" in v.label


def test_chapter5_on_another_grid_or_context_says_no_published_figure():
    from analysis.compose import chapter as cc
    keys = ("share_off_hbm", "share_qevict", "share_compressed", "share_disagg")
    F = dict.fromkeys(keys, 0.9)
    found = pd.DataFrame([{"perturbation": "declared values", **F}])
    grid = cc.grid_setting([4096, 8192, 16384, 32768, 65536, 126976], [0.0, 0.2, 0.4, 0.6, 0.8],
                           [0.5, 1.0, 4.0])
    assert all(v.verdict != claims.NOT_TESTABLE for v in cc.share_verdicts(F, found, None, grid))
    other = cc.grid_setting([4096, 8192], [0.6], [1.0])
    for v in cc.share_verdicts(F, found, None, other):
        assert v.verdict == claims.NOT_TESTABLE and "no published figure for this setting" in v.label
    k = {"speedup": 3.8, "at": {1.0: 3.8, 0.5: 3.8, 2.0: 3.8}, "at_gpu": {}, "context": 131072}
    v = cc.kimi_verdict(k)
    assert v.verdict == claims.NOT_TESTABLE and "context_tokens 131072" in v.label
    assert cc.kimi_verdict({**k, "context": 1048576}).verdict != claims.NOT_TESTABLE
    assert np.isfinite(k["speedup"])
