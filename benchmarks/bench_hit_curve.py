"""One-pass LRU hit curve vs the per-capacity reference simulator, on the Mooncake conversation trace.

    python benchmarks/bench_hit_curve.py [--capacities 30] [--trace mooncake_conversation]

Measures, in the same run: reading the trace; the one-pass curve for *all* capacities
(analysis.tiering.lru_hit_curve); the reference LRU simulator of tests/_tiering_reference.py at N
capacities (log-spaced). Checks that both agree exactly at those capacities and prints the ratio.
Exit status 1 if the one-pass curve takes >= 2 s or is less than 10x faster.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _tiering_reference import lru_prefix_hits_fast  # noqa: E402

from analysis.tiering import load_trace, lru_hit_curve  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacities", type=int, default=30)
    ap.add_argument("--trace", default="mooncake_conversation")
    ap.add_argument("--repeat", type=int, default=3, help="one-pass repetitions (best time reported)")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    tr = load_trace(a.trace)
    t_load = time.perf_counter() - t0

    one = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        hc = lru_hit_curve(tr)
        one.append(time.perf_counter() - t0)
    t_one = min(one)

    caps = np.unique(np.geomspace(16, tr.n_unique_blocks, a.capacities).astype(int))
    reqs = [tr.request_blocks(i).tolist() for i in range(tr.n_requests)]
    toks = [tr.block_tokens[tr.offsets[i]:tr.offsets[i + 1]].tolist() for i in range(tr.n_requests)]
    t0 = time.perf_counter()
    ref = [lru_prefix_hits_fast(reqs, int(c), toks) for c in caps]
    t_ref = time.perf_counter() - t0
    exact = all((hc.block_hits(c), hc.token_hits(c)) == r for c, r in zip(caps, ref))

    ratio = t_ref / t_one
    print(f"trace {tr.name}: {tr.n_requests:,} requests, {tr.n_blocks:,} block accesses, "
          f"{tr.n_unique_blocks:,} distinct blocks (read in {t_load:.2f} s)")
    print(f"one-pass curve, all {hc.capacities.size:,} step capacities: {t_one:.3f} s (best of {a.repeat})")
    print(f"reference LRU simulator at {caps.size} capacities: {t_ref:.2f} s "
          f"({t_ref / caps.size:.3f} s each)")
    print(f"exact agreement at all {caps.size} capacities: {exact}")
    print(f"speed-up: {ratio:.1f}x")
    ok = exact and t_one < 2.0 and ratio >= 10
    print("PASS" if ok else "FAIL: needs exact agreement, < 2 s and >= 10x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
