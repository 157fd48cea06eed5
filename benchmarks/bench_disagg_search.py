"""Candidate plans priced per second by the vectorised parallelism / sizing search (chapter 3).

    python benchmarks/bench_disagg_search.py [--model Llama-3.1-70B] [--device H100-SXM5-80GB] [--repeat 5]

Prices every candidate configuration of every unit of the five modes (C, PD, AF, 3-way, PDAF) for
one model and workload -- devices per instance, TP, DP/EP, batch, chunk size, prefill utilisation,
micro-batches -- and reports candidates per second (best of ``--repeat`` runs, one process), then the
same for a search over the 12 NPU design points (each role choosing its device type). Exit status 1
below 100,000 candidates per second.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.disagg import devices, study  # noqa: E402
from analysis.disagg import search as S
from analysis.forward import Efficiency, Precision  # noqa: E402


def measure(model, hw, grid, repeat):
    wl = S.Workload(8192, 1000)
    best, n = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = 0
        memo = {}
        for mode in S.MODES:
            for c in S.mode_candidates(mode, model, wl, hw, budget=64, prec=Precision.named("fp8"),
                                       eff=Efficiency(), grid=grid, _memo=memo):
                n += 0 if c.get("_counted") else len(c["rate"])
                c["_counted"] = True
        best = min(best, time.perf_counter() - t0)
    return n, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Llama-3.1-70B")
    ap.add_argument("--device", default="H100-SXM5-80GB")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    n, t = measure(a.model, S.default_hardware(a.device), S.Grid(), a.repeat)
    print(f"GPU search ({a.model}, {a.device}): {n:,} distinct candidates in {t * 1e3:.1f} ms "
          f"= {n / t:,.0f} candidates/s")
    n2, t2 = measure(a.model, S.default_hardware(devices.npu_names()), study.npu_grid(),
                     max(1, a.repeat // 2))
    print(f"NPU search ({a.model}, 12 design points per role): {n2:,} candidates in {t2:.2f} s "
          f"= {n2 / t2:,.0f} candidates/s")
    rate = min(n / t, n2 / t2)
    if rate < 100_000:
        print(f"FAIL: {rate:,.0f} candidates/s is below 100,000")
        return 1
    print("OK: >= 100,000 candidates/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
