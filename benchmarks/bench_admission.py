"""Admission/eviction runs (libCacheSim) and routing curves on the Mooncake conversation trace.

    python benchmarks/bench_admission.py [--capacities-mtok 1 3 10] [--trace mooncake_conversation]

Times one simulation per (eviction, admission) pair and capacity (best of ``--repeat``), and one
routing curve per policy (:mod:`analysis.tiering.cluster`), printing the load average next to the
times. Exit status 1 if any single run takes more than 2 s (the target of issue 15).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.tiering import admission as A  # noqa: E402
from analysis.tiering import load_trace, lru_hit_curve  # noqa: E402

RUNS = [("lru", "all"), ("s3fifo", "all"), ("sieve", "all"), ("arc", "all"), ("wtinylfu", "all"),
        ("belady", "all"), ("lru", "second_use"), ("lru", "oracle_reuse")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacities-mtok", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    ap.add_argument("--trace", default="mooncake_conversation")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--limit-s", type=float, default=2.0)
    a = ap.parse_args(argv)
    tr = load_trace(a.trace)
    hc = lru_hit_curve(tr)
    print(f"trace {tr.name}: {tr.n_requests:,} requests, {tr.n_blocks:,} block accesses; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    worst = 0.0
    for p, adm in RUNS:
        for m in a.capacities_mtok:
            c = max(1, int(m * 1e6 / tr.block_size))
            best = min(_timed(lambda: A.simulate(tr, c, p, adm, hc, library_lru=True))
                       for _ in range(a.repeat))
            worst = max(worst, best)
            print(f"{p:>9} + {adm:<12} {m:6.1f}M tokens: {best:6.2f} s")
    try:
        from analysis.tiering import cluster as CL
    except ImportError:
        CL = None
    if CL is not None:
        for pol in CL.ROUTING:
            t = _timed(lambda: CL.route(tr, 8, pol, int(3e6 / tr.block_size)))
            worst = max(worst, t)
            print(f"routing {pol:>14}, 8 instances of 3M tokens: {t:6.2f} s")
    print(f"slowest run {worst:.2f} s (limit {a.limit_s:g} s); load average now {os.getloadavg()[0]:.2f}")
    return 0 if worst <= a.limit_s else 1


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
