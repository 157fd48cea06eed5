"""The search's shared pricing gives exactly what pricing every candidate on its own gives: a split
unit's device pairs sharing each device's side (search._SIDE_MEMO), the cheapest candidate per instance
size without a sort, the vectorised rate-matched choice, and the measured tables' grids."""
import itertools

import numpy as np
import pandas as pd
import pytest

from analysis import forward as costs
from analysis import measured as M
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision

PTS = ["NPU-250T-64G", "NPU-5000T-16G", "NPU-1000T-190G"]
GRID = S.Grid(sizes=(1, 2, 4, 8), batches=(1, 16, 256), chunks=(1024, 4096), prefill_batches=(1, 4),
              utilisations=(0.6, 0.9), microbatches=(1, 2))


@pytest.mark.parametrize("unit,roles", [("AF", ("A", "F")), ("PAF", ("PA", "PF")), ("DAF", ("DA", "DF"))])
@pytest.mark.parametrize("model", ["Qwen3-30B-A3B", "Llama-3.1-70B"])  # MoE and dense (FFN all-reduce)
def test_split_unit_pairs_share_sides_exactly(unit, roles, model):
    wl = S.Workload(4096, 512)
    kw = dict(prec=Precision.named("fp8"), eff=Efficiency(), grid=GRID, budget=16)
    hw = S.default_hardware(PTS)
    shared = S.unit_candidates(unit, roles, model, wl, hw, **kw)
    parts = []
    for pair in itertools.product(PTS, PTS):  # each pair priced on its own, nothing shared
        with costs.ledger() as led:
            p = S.role_candidates(unit, model, wl, pair, **kw)
        p["measured_share"] = np.broadcast_to(np.asarray(led.measured_share, float), np.shape(p["rate"]))
        parts.append(p)
    for k in shared:
        if k in ("_hw", "hw_idx"):
            continue
        ref = np.concatenate([p[k] for p in parts])
        assert shared[k].dtype == ref.dtype and shared[k].tobytes() == ref.tobytes(), k


def _cheapest_by_sort(idx, devices, cost):
    order = idx[np.lexsort((cost[idx], devices[idx]))]
    dv = devices[order]
    return order[np.arange(len(dv)) - np.searchsorted(dv, dv, side="left") < 1]


def test_cheapest_per_size_is_the_stable_sort_choice_with_ties():
    rng = np.random.default_rng(3)
    devices = rng.integers(1, 20, 5000).astype(float)
    cost = rng.integers(0, 30, 5000).astype(float)  # many ties: the first index must win
    idx = np.flatnonzero(rng.random(5000) < 0.6)
    got = S._cheapest_per_size(idx, devices[idx], cost[idx])
    assert np.array_equal(got, _cheapest_by_sort(idx, devices, cost))


@pytest.mark.parametrize("mode", ["C", "PD", "3-way", "PDAF"])
def test_rate_matched_choice_equals_the_best_of_every_combination(mode):
    wl, slo = S.Workload(2048, 256), S.SLO(2.0, 0.05)
    kw = dict(budget=16, grid=GRID, prec=Precision.named("fp8"), eff=Efficiency())
    hw = S.default_hardware("H100-SXM5-80GB")
    best = S.best_plan(mode, "Qwen3-30B-A3B", wl, slo, hw, **kw)
    # the loop over every combination, sorted by cost (stable): the top plan of _top=1
    top = S.top_plans(mode, "Qwen3-30B-A3B", wl, slo, hw, k=1, **kw)[0]
    assert best.feasible and top.feasible
    assert best.units == top.units and best.tokens_per_s_per_device == top.tokens_per_s_per_device


def _grids_per_key(df, outer, cont):  # the per-key reference: one grouped mean per key
    out = {}
    for k, g in df.groupby(outer, sort=True):
        g = g.groupby(cont, sort=True)["_loglat"].mean()
        idx = g.index if len(cont) > 1 else pd.MultiIndex.from_arrays([g.index])
        axes = tuple(np.log(np.asarray(lv, dtype=float)) for lv in idx.levels)
        vals = np.full(tuple(len(a) for a in axes), np.nan)
        vals[tuple(np.asarray(c) for c in idx.codes)] = g.to_numpy()
        out[k if isinstance(k, tuple) else (k,)] = (axes, vals)
    return out


def test_table_grids_match_a_grouped_mean_per_key():
    rng = np.random.default_rng(5)
    n = 400
    df = pd.DataFrame({"dtype": rng.choice(["fp8", "bf16"], n), "e": rng.choice([8, 64, 128], n),
                       "tokens": rng.choice([1, 2, 8, 64, 512], n), "ep": rng.choice([1, 2, 4], n),
                       "_loglat": rng.normal(size=n)})  # repeated points: their mean of logs
    got = M._grids(df, ["dtype", "e"], ["tokens", "ep"])
    ref = _grids_per_key(df, ["dtype", "e"], ["tokens", "ep"])
    assert list(got) == list(ref)
    assert all(tuple(map(type, a)) == tuple(map(type, b)) for a, b in zip(got, ref))  # Python scalars
    for k, (axes, vals) in ref.items():
        assert all(np.array_equal(a, b) for a, b in zip(got[k].axes, axes))
        assert got[k].values.tobytes() == vals.tobytes()
