"""Frequency-gated demotion (admission on a block's second use), the offline bounds labelled as such,
and the cluster sized under the routing it would really use (issue 32, item 4)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tiering_hitcurve import random_requests  # noqa: E402

from analysis.tiering import admission as A  # noqa: E402
from analysis.tiering import chapter, figures, from_requests, lru_hit_curve  # noqa: E402
from analysis.tiering import replay as R  # noqa: E402
from analysis.tiering import tiers as T  # noqa: E402
from analysis.tiering.configure import deployment, economics  # noqa: E402
from analysis.tiering.params import SCHEMA  # noqa: E402

BOOK = Path(__file__).resolve().parents[1] / "book" / "02_ssd_offload.md"
EVIDENCE = BOOK.with_name("02_ssd_offload_evidence.md")  # the admission study lives on the evidence page


def _trace(seed, n_req=300, gap_ms=150):
    reqs = random_requests(seed, n_req=n_req)
    for i, r in enumerate(reqs):
        r["timestamp"] = i * gap_ms
    return from_requests(reqs, name=f"r{seed}")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_every_access_is_a_hit_a_written_miss_or_a_refused_first_use(seed, policy):
    """Conservation under the gate: a first use always misses and is never written; every other miss is
    written. Without the gate every miss would be written."""
    tr = _trace(seed)
    for cap in (3, 10, 40):
        g = A.simulate(tr, cap, policy, "second_use")
        misses = tr.n_blocks - g["access_hits"]
        assert g["written_blocks"] == misses - tr.n_unique_blocks
        assert g["hit_blocks"] <= g["access_hits"] <= tr.n_blocks


@pytest.mark.parametrize("seed", range(3))
def test_gate_write_savings_are_monotone_and_at_least_one_write_per_block(seed):
    """Under LRU the gate is LRU on the trace without first uses (a stack algorithm): its writes fall as
    the store grows, and it saves at least one write per distinct block against writing every miss."""
    tr = _trace(seed)
    hc = lru_hit_curve(tr)
    caps = [2, 4, 8, 16, 32, 64]
    gated = [A.simulate(tr, c, "lru", "second_use")["written_blocks"] for c in caps]
    full = [A.simulate(tr, c, "lru", "all", hc)["written_blocks"] for c in caps]
    assert all(a >= b for a, b in zip(gated, gated[1:])), gated
    assert all(f - g >= tr.n_unique_blocks for f, g in zip(full, gated)), (full, gated)


def _acost(rows):
    df = pd.DataFrame(rows)
    df["run"] = df["policy"] + " + " + df["admission"]
    df["label"] = [chapter.run_label(p, a) for p, a in zip(df["policy"], df["admission"])]
    df["capacity_tokens"] = df["capacity_blocks"] * 512
    df["capacity (M tokens)"] = df["capacity_tokens"] / 1e6
    df["seconds"] = 0.1
    return df


def test_gate_savings_and_the_best_realisable_pair():
    rows = [dict(policy=p, admission=a, capacity_blocks=100, token_hit_rate=h, tb_written_per_h=w,
                 wear_usd_per_h=wu, busy_usd_per_mtok=c)
            for p, a, h, w, wu, c in [("lru", "all", 0.10, 40.0, 4.0, 0.33),
                                      ("lru", "second_use", 0.14, 10.0, 1.0, 0.30),
                                      ("belady", "all", 0.30, 30.0, 3.0, 0.25),
                                      ("lru", "oracle_reuse", 0.16, 2.0, 0.2, 0.28)]]
    acost = _acost(rows)
    g = chapter.gate_savings(acost, 100)
    assert g["write_saving"] == pytest.approx(0.75)
    assert g["life_x"] == pytest.approx(4.0)
    assert g["wear_saved_usd_per_h"] == pytest.approx(3.0)
    assert g["hit_change"] == pytest.approx(0.04)
    an = chapter.admission_numbers(acost, [100], type("T", (), {"block_size": 512})())
    assert an["best"] == "belady + all" and "offline bound" in an["best_label"]
    assert an["best_real"] == "lru + second_use"  # the offline pairs are never named as deployable
    assert np.isnan(chapter.gate_savings(acost[acost.admission != "second_use"], 100)["write_saving"])


def test_offline_pairs_are_labelled_the_offline_bound():
    assert chapter.run_label("belady", "all") == "belady + all (offline bound)"
    assert chapter.run_label("lru", "oracle_reuse").endswith("(offline bound)")
    assert chapter.run_label("lru", "second_use") == "lru + second_use"
    rows = [dict(policy=p, admission=a, capacity_blocks=c, token_hit_rate=0.1, tb_written_per_h=1.0)
            for p, a in [("lru", "all"), ("belady", "all")] for c in (100, 200)]
    fig = figures.fig_admission(_acost(rows))
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "belady + all (offline bound)" in labels


@pytest.mark.parametrize("page", [BOOK, EVIDENCE], ids=lambda p: p.stem)
def test_belady_is_never_called_best_in_the_chapter(page):
    """No sentence of chapter 2 or its evidence page that names Belady calls anything 'best' (Belady is
    the offline bound), and each page that names Belady says so."""
    text = page.read_text(encoding="utf-8")
    sentences = re.split(r"(?<=[.;:])\s+", re.sub(r"\s+", " ", text))
    bad = [s for s in sentences if re.search(r"belady", s, re.I) and re.search(r"\bbest\b", s, re.I)]
    assert bad == []
    assert re.search(r"Belady[^.]*offline bound", text)


@pytest.fixture(scope="module")
def setup():
    cfg = SCHEMA.config(SCHEMA.defaults())
    dep = deployment(cfg)
    return dep, economics(cfg, dep)


def test_routed_ttft_on_one_instance_is_the_shared_queue(setup):
    dep, econ = setup
    tr = _trace(4, n_req=120)
    hc = lru_hit_curve(tr)
    svc = R.service_times(tr, hc, T.build_tiers("dram", dep), dep, config="dram")
    one = np.zeros(tr.n_requests, dtype=int)
    np.testing.assert_allclose(R.routed_ttft(tr, svc, dep, econ, one),
                               R.outcome(tr, svc, dep, econ, 1).ttft_s)
    with pytest.raises(ValueError, match="one instance per request"):
        R.routed_ttft(tr, svc, dep, econ, one[:-1])


def test_routed_sizing_is_the_smallest_cluster_meeting_the_slo(setup):
    dep, econ = setup
    tr = _trace(5, n_req=200, gap_ms=40)
    tiers = T.build_tiers("dram", dep)
    o = R.size_routed(tr, tiers, dep, econ, "round_robin", max_instances=32)
    assert o is not None and o.attainment >= econ.attainment_target
    assert o.extra["routing"] == "round_robin"
    # searching down from a larger start finds the same size
    assert R.size_routed(tr, tiers, dep, econ, "round_robin", max_instances=32,
                         start=o.n_instances + 3).n_instances == o.n_instances
    duration = max(float(tr.arrival_s[-1] / econ.load_scale), 1.0)
    if o.n_instances > 1:  # one fewer misses the target, or its busy time cannot fit the trace (the
        # chapter's convention, as the single-stack sizing's)
        n = o.n_instances - 1
        svc, r = R.routed_service(tr, tiers, dep, n, "round_robin", load_scale=econ.load_scale)
        ttft = R.routed_ttft(tr, svc, dep, econ, r["assignment"])
        assert np.mean(ttft <= econ.slo_s) < econ.attainment_target or svc.service_s.sum() / duration > n
