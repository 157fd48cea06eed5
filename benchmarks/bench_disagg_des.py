"""Seconds to simulate one plan over the Mooncake conversation trace (chapter 3's event simulation).

    python benchmarks/bench_disagg_des.py [--model Qwen3-235B-A22B] [--device H100-SXM5-80GB]

For the best plan of each mode (analytic screen, 64 devices, FP8, the chapter's SLOs) replays the
trace's 12,031 requests (its lengths and its arrival times rescaled to 90% of the plan's capacity)
through whole instances and prints the wall time per plan, the load average and the 90th-percentile
TTFT/TPOT. Exit status 1 if any plan takes more than 2 s of CPU time (the issue's target, on the 2-core
machine). The target is judged on the process's CPU time, which other jobs on a shared machine do not
inflate; the wall time is printed beside it with the load average.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.disagg import des, study  # noqa: E402
from analysis.disagg import search as S
from analysis.forward import Precision  # noqa: E402
from analysis.traces import load_trace  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen3-235B-A22B")
    ap.add_argument("--device", default="H100-SXM5-80GB")
    a = ap.parse_args()
    t = load_trace("mooncake_conversation")
    wl = S.Workload.from_lengths(t.input_tokens, t.output_tokens)
    slo = study.slo_for(wl.input_tokens, 2.0, 0.5, 0.05)
    prec, grid = Precision.named("fp8"), study.gpu_grid()
    worst = 0.0
    print(f"load average before: {os.getloadavg()}")
    for mode in S.MODES:
        p = S.best_plan(mode, a.model, wl, slo, S.default_hardware(a.device), budget=64, prec=prec, grid=grid)
        if not p.feasible:
            print(f"{mode}: no feasible plan")
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        r = des.simulate(p, a.model, wl, budget=64, trace_s=t.arrival_s, slo=slo, prec=prec, grid=grid)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        worst = max(worst, cpu)
        print(f"{mode:6s} {cpu:5.2f} s CPU ({dt:5.2f} s wall)  {len(r.ttft):,} requests  "
              f"p90 TTFT {r.p90_ttft_s:.2f} s  "
              f"p90 TPOT {r.p90_tpot_s * 1e3:.1f} ms  instances {r.instances}")
    print(f"load average after: {os.getloadavg()}; slowest plan {worst:.2f} s CPU (target <= 2 s)")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
