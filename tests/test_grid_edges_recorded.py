"""Grid edges at the right depth (issue 27 item 2): one search warns of its plan's grid edges; the
functions that price many plans for a page record the edges in their result and let no
GridEdgeWarning reach the page; the page's count equals the plans whose edges are non-empty."""
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis.compose import decide, pipeline
from analysis.compose.fidelity import KVPolicy
from analysis.compose.pipeline import ComposeError, ReuseCurve, Scenario
from analysis.disagg import search as S
from analysis.disagg import study

MODEL = "Llama-3.1-8B"
H100 = "H100-SXM5-80GB"
REUSE = ReuseCurve(np.linspace(1e5, 2e7, 200), np.linspace(0.005, 1.0, 200), 10000.0, "synthetic")
KIVI = KVPolicy("kivi4", 0.5, hot_ratio=0.5, kl=0.01, top1=0.95)
BASE = Scenario(model="Llama-3.1-70B", gpu=H100, input_tokens=16384, output_tokens=1000)


def _edge_warnings(rec):
    return [w for w in rec if issubclass(w.category, S.GridEdgeWarning)]


def _small_grid():
    return S.Grid(sizes=(1, 2, 4), tps=(1, 2), batches=(8, 16, 32, 64), prefill_batches=(1, 2),
                  utilisations=(0.5, 0.9), overlaps=(1,))


def test_one_search_still_warns_of_its_edges():
    """A direct call of the search on one plan at an edge warns, naming the edges the plan keeps."""
    with pytest.warns(S.GridEdgeWarning) as rec:
        p = S.best_plan("PD", MODEL, S.Workload(2000, 200), S.SLO(5.0, 0.1), S.default_hardware(H100),
                        budget=16, grid=_small_grid())
    assert p.feasible and p.edges
    msg = " ".join(str(w.message) for w in _edge_warnings(rec))
    assert all(e.split(".")[-1] in S.describe_edges([e], _small_grid(), 16) for e in p.edges)
    assert S.describe_edges(p.edges, _small_grid(), 16) in msg


def test_edges_kept_silences_only_grid_edge_warnings_and_only_inside():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with S.edges_kept():
            S.best_plan("PD", MODEL, S.Workload(2000, 200), S.SLO(5.0, 0.1), S.default_hardware(H100),
                        budget=16, grid=_small_grid())
            warnings.warn("another warning", UserWarning)
        assert _edge_warnings(rec) == []
        assert any("another warning" in str(w.message) for w in rec)
    with pytest.warns(S.GridEdgeWarning):  # the filter ends with the block
        S.best_plan("PD", MODEL, S.Workload(2000, 200), S.SLO(5.0, 0.1), S.default_hardware(H100),
                    budget=16, grid=_small_grid())


def test_chapter3_cell_records_edges_without_warning(recwarn):
    """study.run_cell (every sweep, ablation and Mooncake cell goes through it) prices every mode's best
    plan: no GridEdgeWarning, and each row's edges are those the search gives the same plan."""
    warnings.simplefilter("always")
    wl, slo, g = S.Workload(2000, 200), S.SLO(5.0, 0.1), _small_grid()
    rows = study.run_cell(MODEL, H100, S.default_hardware(H100), wl, slo, budget=16, precision="bf16",
                          objective="device", grid=g, enforce_context=True, modes=("C", "PD"))
    assert _edge_warnings(recwarn.list) == []
    with pytest.warns(S.GridEdgeWarning):
        direct = S.best_plan("PD", MODEL, wl, slo, S.default_hardware(H100), budget=16, grid=g)
    pd_row = next(r for r in rows if r["mode"] == "PD")
    assert pd_row["edges"] == ",".join(direct.edges) != ""


def test_pareto_records_edges_per_plan(recwarn):
    warnings.simplefilter("always")
    tps, edges = S.pareto("PD", MODEL, S.Workload(2000, 200), 5.0, [0.05, 0.1], S.default_hardware(H100),
                          with_edges=True, budget=16, grid=_small_grid())
    assert len(edges) == 2 and all(isinstance(e, list) for e in edges)
    assert any(edges)  # the lax SLO puts the prefill pool at its utilisation cap
    assert len(_edge_warnings(recwarn.list)) == sum(bool(e) for e in edges)  # pareto itself still warns
    assert np.array_equal(S.pareto("PD", MODEL, S.Workload(2000, 200), 5.0, [0.05, 0.1],
                                   S.default_hardware(H100), budget=16, grid=_small_grid()), tps,
                          equal_nan=True)


def test_chapter5_map_records_edges_and_warns_nothing(recwarn):
    """Chapter 5's map prices chapter 3's plans through pipeline.plan: no GridEdgeWarning reaches the
    caller; every row records its plan's edges; the count equals the distinct plans with edges."""
    warnings.simplefilter("always")
    pipeline.plan.cache_clear()  # price the plans afresh (the memo would hide a warning)
    opts = decide.options(["hbm", "nvme"], [KVPolicy.full(), KIVI], ["C", "PD"])
    cells, every = decide.decision_map(BASE, [4096, 16384], [0.0, 0.6], [1.0], opts, REUSE, 0.75)
    assert _edge_warnings(recwarn.list) == []
    assert every["plan_edges"].notna().any()
    counts = decide.edge_counts(every, opts)
    per = counts["per_plan"]
    # one plan per prompt x mode x KV bytes x overlap (the layouts and hit rates share it)
    assert counts["plans"] == len(per) == len(per.drop_duplicates(["context", "mode", "kv_hot_ratio",
                                                                    "plan_overlap"]))
    assert counts["at_edge"] == int((per["edges"] != "").sum()) > 0  # some plans do sit at an edge
    assert sum(counts["kinds"].values()) >= counts["at_edge"]
    # each recorded plan's edges are what the search gives that plan
    for _, r in per.iterrows():
        p = pipeline.plan(r["mode"], BASE.model, BASE.gpu, float(r["context"]), float(BASE.output_tokens),
                          float(BASE.ttft_slo_s), float(BASE.tpot_slo_s), int(BASE.budget_devices),
                          float(r["kv_hot_ratio"]), float(BASE.transfer_overhead), bool(r["plan_overlap"]))
        assert ",".join(p.edges) == r["edges"]
    line = decide.edge_line(counts)
    assert line.startswith(f"{counts['at_edge']:,} of the {counts['plans']:,} chapter 3 plans")


def test_edge_counts_counts_each_plan_once():
    every = pd.DataFrame({
        "context": [4096, 4096, 4096, 8192, 8192, 8192],
        "mode": ["C", "C", "PD", "C", "PD", "PD"],
        "option": ["a", "b", "a", "a", "a", "c"],
        "plan_overlap": [True] * 6,
        "plan_edges": ["D.batch,budget", "D.batch,budget", "", "C.batch", None, "P.rho"],
    })
    opts = [type("O", (), {"label": lab, "policy": KVPolicy.full()})() for lab in ("a", "b")]
    opts.append(type("O", (), {"label": "c", "policy": KIVI})())
    c = decide.edge_counts(every, opts)
    # "a" and "b" share a KV size: one plan at 4096/C; the None row priced no plan
    assert c["plans"] == 4 and c["at_edge"] == 3
    assert c["kinds"] == {"batch": 2, "budget": 1, "rho": 1}
    line = decide.edge_line(c)
    assert line.startswith("3 of the 4 chapter 3 plans") and "2 at the largest decode batch" in line
    with pytest.raises(ComposeError, match="not in opts"):
        decide.edge_counts(every, opts[:1])


def test_production_decode_throughput_reports_the_edges_it_warns_of():
    """production.decode_throughput (the StepFun, MegaScale-Infer and revalidation cells) passes the chosen
    configuration's edges on, so the tables that record them are not empty where a warning named edges."""
    from analysis.disagg import production as P

    with pytest.warns(S.GridEdgeWarning) as rec:
        r = P.decode_throughput(MODEL, H100, "D", precision="bf16", budget=16, grid=_small_grid())
    assert r["edges"] and S.describe_edges(r["edges"], _small_grid().limited(16), 16) in " ".join(
        str(w.message) for w in _edge_warnings(rec))
