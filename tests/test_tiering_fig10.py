"""Mooncake's Figure 10 setting (FAST'25 Sec. 5.3.2): N instances with local caches and routing
against one global pool of all their capacity (analysis.tiering.cluster.local_vs_global)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tiering_hitcurve import random_requests  # noqa: E402

from analysis import claims, data  # noqa: E402
from analysis.tiering import chapter, from_requests, lru_hit_curve  # noqa: E402
from analysis.tiering import cluster as CL  # noqa: E402
from analysis.tiering.configure import deployment  # noqa: E402
from analysis.tiering.params import SCHEMA  # noqa: E402


@pytest.fixture(scope="module")
def dep():
    return deployment(SCHEMA.config(SCHEMA.defaults()))


@pytest.mark.parametrize("seed", range(3))
def test_global_pool_holding_every_block_beats_any_routing(dep, seed):
    """With the pool holding every distinct block, it misses only first uses: no routing of the same
    total capacity over separate caches can hit more, and its prefill time cannot be longer."""
    tr = from_requests(random_requests(seed, n_req=200), name="r")
    hc = lru_hit_curve(tr)
    n = 4
    cap_blocks = -(-tr.n_unique_blocks // n)  # n x cap >= distinct blocks; one cache alone holds a quarter
    bound = hc.token_hit_rate(tr.n_unique_blocks + 1)
    for policy in CL.ROUTING:
        r = CL.local_vs_global(tr, dep, n, cap_blocks * tr.block_size, hc=hc, policy=policy)
        assert r["global_hit"] == pytest.approx(bound)
        assert r["global_hit"] >= r["local_hit"] - 1e-12, policy
        assert r["prefill_ratio"] <= 1 + 1e-12, policy
        assert r["hit_ratio"] == pytest.approx(r["global_hit"] / r["local_hit"])
    # splitting the cache loses reuse under cache-oblivious placement: strictly below the pool
    rnd = CL.local_vs_global(tr, dep, n, cap_blocks * tr.block_size, hc=hc, policy="random")
    assert rnd["local_hit"] < rnd["global_hit"]
    assert rnd["prefill_ratio"] < 1


def test_one_instance_is_its_own_pool(dep):
    tr = from_requests(random_requests(5, n_req=150), name="r")
    for cap in (4, 20):
        r = CL.local_vs_global(tr, dep, 1, cap * tr.block_size, policy="kv_aware")
        assert r["local_hit"] == pytest.approx(r["global_hit"])
        assert r["prefill_ratio"] == pytest.approx(1.0)
        assert r["local_hit"] == pytest.approx(lru_hit_curve(tr).token_hit_rate(cap))


def test_prefill_time_falls_with_hits(dep):
    """The mean prefill time is computed from the uncached tokens: more hits, less time."""
    tr = from_requests(random_requests(1, n_req=200), name="r")
    small = CL.local_vs_global(tr, dep, 4, 2 * tr.block_size, policy="random")
    big = CL.local_vs_global(tr, dep, 4, 50 * tr.block_size, policy="random")
    assert big["local_hit"] > small["local_hit"]
    assert big["local_prefill_s"] < small["local_prefill_s"] < small["nocache_prefill_s"]


def test_bad_capacity_says_what_to_do(dep):
    tr = from_requests(random_requests(0), name="r")
    with pytest.raises(ValueError, match="no whole block"):
        CL.local_vs_global(tr, dep, 2, tr.block_size / 2)
    with pytest.raises(ValueError, match="must be > 0"):
        CL.local_vs_global(tr, dep, 2, 0)


def test_chapter_fig10_rows_and_missing_trace(dep, monkeypatch):
    """A trace whose file cannot be obtained gets a not-testable verdict saying so; a computed one is
    judged against the published ratios of its own trace."""
    tr = from_requests(random_requests(2, n_req=200), name="r")
    hc = lru_hit_curve(tr)

    def load(name, n=0):
        raise data.DataError("data file 'mooncake_toolagent' not found")

    monkeypatch.setattr(chapter, "load", load)
    f = chapter.fig10(["mooncake_conversation", "mooncake_toolagent"], 0, dep, 3, 8 * tr.block_size / 1e6,
                      1.0, 2, own=("mooncake_conversation", tr, hc))
    v = f["verdicts"]
    assert v["mooncake_toolagent"].verdict == claims.NOT_TESTABLE
    assert "not available" in v["mooncake_toolagent"].label
    conv = v["mooncake_conversation"]
    assert conv.verdict != claims.NOT_TESTABLE
    assert [c[2] for c in conv.components] == [
        data.published("mooncake_fig10_conversation_hit_ratio")["value"],
        data.published("mooncake_fig10_conversation_prefill_ratio")["value"]]
    n = chapter.fig10_numbers(f["table"])
    assert n["missing"] == ["tool&agent"] and set(n) == {"missing", "conversation"}
    rows = dict((k, t) for k, t, _ in chapter.fig10_rows(n, v))
    assert "tool&agent" in rows["ch2_fig10_global_text"]
    # the estimate of the missing effect lies in [0, 1] when the paper's local rate is between random
    # placement and this router
    c = n["conversation"]
    if c["local_hit_random"] <= c["pub_local_hit"] <= c["local_hit"]:
        assert 0 <= c["oblivious_share"] <= 1


def test_a_trace_without_published_fig10_bars_is_replayed_and_not_testable(dep):
    """A trace of fig10_traces that the paper did not run (an agent family, a path) alone: its replay is
    shown, its verdict is not testable, and the prose says the paper has no value (this raised
    KeyError 'pub_global_hit' before)."""
    from analysis.tiering import figures

    tr = from_requests(random_requests(3, n_req=200), name="r")
    hc = lru_hit_curve(tr)
    f = chapter.fig10(["lmcache_miniswe"], 0, dep, 3, 8 * tr.block_size / 1e6, 1.0, 2,
                      own=("lmcache_miniswe", tr, hc))
    v = f["verdicts"]["lmcache_miniswe"]
    assert v.verdict == claims.NOT_TESTABLE and "no published figure" in v.label
    n = chapter.fig10_numbers(f["table"])
    assert np.isfinite(n["lmcache_miniswe"]["hit_ratio"]) and np.isnan(n["lmcache_miniswe"]["pub_hit_ratio"])
    rows = dict((k, t) for k, t, _ in chapter.fig10_rows(n, f["verdicts"]))
    assert "no published value" in rows["ch2_fig10_global_text"]
    assert "no published value" in rows["ch2_fig10_ratio_text"] and "nan" not in rows["ch2_fig10_ratio_text"]
    assert "no bars" in rows["ch2_fig10_oblivious_text"]
    figures.fig_fig10(f["table"])  # draws the replay's bars without the paper's


def test_published_fig10_bars_agree_with_printed_ratios():
    """The bars read from the PDF's vector paths reproduce the ratios printed above them."""
    for k in ("conversation", "toolagent", "synthetic"):
        p = {q: data.published(f"mooncake_fig10_{k}_{q}")["value"] for q in (
            "local_hit", "global_hit", "hit_ratio", "local_prefill_s", "global_prefill_s", "prefill_ratio")}
        assert p["global_hit"] / p["local_hit"] == pytest.approx(p["hit_ratio"], abs=0.006)
        assert p["global_prefill_s"] / p["local_prefill_s"] == pytest.approx(p["prefill_ratio"], abs=0.006)
        assert np.isfinite(list(p.values())).all()


def test_too_many_fig10_instances_for_the_trace_is_refused_early():
    from analysis.tiering.configure import check_against_trace

    tr = from_requests(random_requests(0, n_req=20), name="r")
    vals = SCHEMA.defaults() | {"routing_instances": [1, 2], "fig10_instances": 50}
    with pytest.raises(ValueError, match="fig10_instances = 50 exceeds"):
        check_against_trace(SCHEMA.config(vals), tr)
    check_against_trace(SCHEMA.config(vals | {"fig10_instances": 10}), tr)
