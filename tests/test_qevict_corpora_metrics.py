"""Chapter 4 corpora (deterministic needles) and drift metrics on synthetic attention."""
import numpy as np
import pandas as pd
import pytest

from analysis.qevict import corpora
from analysis.qevict.metrics import bootstrap_ci, compare, global_lir


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("gguf")
    from analysis.qevict.gguf_model import gguf_path
    try:
        gguf_path()
    except FileNotFoundError as e:  # pragma: no cover
        pytest.skip(str(e))
    from analysis.qevict.tokenizer import load_tokenizer
    return load_tokenizer()


def test_stdlib_documents(tok):
    d = corpora.load_document("code:argparse", tok, 300)
    assert len(d) == 300 and d.kind == "code"
    # the document is the module's source, from its first character, and its hash is of its tokens
    text = tok.decode(d.tokens[:300])
    assert len(text) > 300 and corpora.module_source("argparse").startswith(text)
    assert d.sha256 == corpora._sha(d.tokens)
    d2 = corpora.load_document("docs:typing", tok, 300)
    prose = tok.decode(d2.tokens[:300])
    assert d2.kind == "docs" and corpora.module_docstrings("typing").startswith(prose)
    assert not corpora.module_source("typing").startswith(prose[:40])  # docstrings, not the source
    assert d2.sha256 != d.sha256


def test_needle_document_deterministic_and_answerable(tok):
    a = corpora.load_document(
        "needle:textwrap", tok, 600, prefill_tokens=480, n_needles=3, n_queries=2, seed=7
    )
    b = corpora.load_document(
        "needle:textwrap", tok, 600, prefill_tokens=480, n_needles=3, n_queries=2, seed=7
    )
    c = corpora.load_document(
        "needle:textwrap", tok, 600, prefill_tokens=480, n_needles=3, n_queries=2, seed=8
    )
    assert np.array_equal(a.tokens, b.tokens) and a.sha256 == b.sha256
    assert a.sha256 != c.sha256
    assert len(a) == 600 and len(a.answers) == 2
    prompt = tok.decode(a.tokens[:480])
    for (s, e), key in zip(a.answers, a.meta["queried"]):
        value = tok.decode(a.tokens[s:e])
        assert value == a.meta["values"][a.meta["keys"].index(key)]
        assert f"The special magic number for {key} is {value}." in prompt
        assert s > 480


def test_bad_specs(tok):
    for bad in ("argparse", "code:", "blob:argparse"):
        with pytest.raises(ValueError):
            corpora.load_document(bad, tok, 100)
    with pytest.raises(FileNotFoundError):
        corpora.load_document("code:no_such_module_xyz", tok, 100)
    with pytest.raises(ValueError):
        corpora.load_document("code:bisect", tok, 10**6)
    with pytest.raises(ValueError):
        corpora.load_document("needle:textwrap", tok, 600)  # needs prefill_tokens


def test_global_lir_synthetic():
    D, L, H, NW, W, P = 40, 2, 1, 6, 4, 20
    a = np.zeros((D, L, H, NW), np.float32)
    a[:, :, :, 0] = 0.5  # sink, excluded
    a[:5, 0, 0, 1] = 0.4  # active, then inactive for the rest: not re-activated
    a[30:, 0, 0, 2] = 0.4  # inactive for 30 steps, then active: re-activated
    a[:, 0, 0, 3] = 0.4  # always active
    a[:, 1, 0, 1:5] = 0.3  # layer 1: all always active
    lir = global_lir(a, P, W, gap=10, tau=1.0, sink_windows=1)
    l0 = lir[lir.layer == 0].iloc[0]
    # windows 1, 2, 4 are inactive for >= 10 steps; only window 2 comes back
    assert l0.inactive_windows == 3 and l0.reactivated == 1
    assert l0.lir == pytest.approx(1 / 3)
    assert l0.reactivated_mass == pytest.approx(0.4 * 10 / D, rel=1e-5)
    assert np.isnan(lir[lir.layer == 1].iloc[0].lir)


def test_bootstrap_and_compare():
    m, lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0], n_boot=500, seed=1)
    assert m == 2.5 and lo < m < hi
    assert bootstrap_ci([1.0, 2.0, 3.0], seed=3) == bootstrap_ci([1.0, 2.0, 3.0], seed=3)
    rows = []
    for d in range(5):
        rows += [
            dict(document=f"d{d}", policy="q", budget=0.2, kl=0.1 + 0.01 * d),
            dict(document=f"d{d}", policy="b", budget=0.2, kl=0.3 + 0.01 * d),
            dict(document=f"d{d}", policy="c", budget=0.2, kl=0.1 + 0.01 * d + (0.05 if d % 2 else -0.05)),
        ]
    cmp = compare(pd.DataFrame(rows), "q", ["b", "c"], "kl")
    assert cmp.set_index("baseline").loc["b", "verdict"] == "better"
    assert cmp.set_index("baseline").loc["c", "verdict"] == "no clear difference"


def test_likelihood_metrics_stop_at_the_first_free_running_token():
    """Inside a free-running span a stream reads back its own prediction, so from then on it conditions
    on another history than the full cache: KL, perplexity, top-1 and token accuracy average only the
    steps before it (the step predicting the first answer token included); ``kl_all`` keeps every step."""
    from analysis.qevict.metrics import shared_history_steps, summarize_run

    P, D, B = 64, 20, 2
    rng = np.random.default_rng(0)
    kl = rng.random((D, B))
    kl[:, 0] = 0
    kl[6:, 1] = 50.0  # a diverged history after the first own token (step 6 feeds position 70)
    res = dict(kl=kl, nll=rng.random((D, B)), top1=rng.random((D, B)) > 0.5,
               correct=rng.random((D, B)) > 0.5, fmm=np.zeros((D, B)), fmm_evicted=np.zeros((D, B)),
               streams=[("full", 1.0), ("kivi4", 0.5)], prefill_tokens=P, free_run_spans=[(70, 73), (80, 82)],
               fits=[True, True], promotions=[0, 0], recall_bytes=[0, 0], offload_bytes=[0, 0],
               hot_bytes=np.ones((2, B)), budget_bytes=np.ones((2, B)), full_bytes_end=1,
               tier_bytes=[dict(full=1, quantized=0, cold=0, evicted=0)] * B)
    sh = shared_history_steps(res)
    assert sh.tolist() == [True] * 6 + [False] * 14
    s = summarize_run(res, "needle:x", answers=[(70, 73), (80, 82)])
    r = s.iloc[1]
    assert r.kl == pytest.approx(kl[:6, 1].mean()) and r.kl_all == pytest.approx(kl[:, 1].mean())
    assert r.scored_steps == 6 and r.decode_steps == D
    assert r.ppl == pytest.approx(np.exp(res["nll"][:6, 1].mean()))
    assert r.top1 == pytest.approx(res["top1"][:6, 1].mean())
    res_tf = dict(res, free_run_spans=[])
    assert shared_history_steps(res_tf).all()
    with pytest.raises(ValueError, match="before the first free-running span"):
        summarize_run(dict(res, free_run_spans=[(P + 0, P + 3)]), "needle:x", answers=[])
