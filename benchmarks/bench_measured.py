"""The measured operator backend (analysis.measured, issue 27 item 1): screening throughput and a
side-by-side of measured and roofline operator times.

    python benchmarks/bench_measured.py [--plans 1000000] [--repeat 3] [--target 1e6] [--gpu H200-SXM-141GB]

Prices ``--plans`` candidate decode plans of Llama-3.1-8B and Llama-3.1-70B (tensor parallel 1-8,
batch 1-511, context 128-32,767 tokens, drawn at random) through
:func:`analysis.forward.colocated_pass_time` with the roofline and with the measured backend (best of
``--repeat``), prints plans per second, the measured share of the plans' time and where the rest fell
back to the roofline and why; then the tables read (each once) and measured against roofline seconds
for a few GEMMs, attention cores and all-reduces on three GPUs. Throughput is plans per second of
this process's CPU time (one thread; the wall-clock rate in parentheses): on 2 shared cores the
wall-clock rate falls with the other processes' load, printed first. Exit status 1 if the measured
backend screens fewer than ``--target`` plans per CPU second (issue 27: at least 1e6) or a table was
read more than once.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from analysis import forward as fw  # noqa: E402
from analysis import measured as M  # noqa: E402
from analysis import roofline, specs  # noqa: E402

DEMO_GPUS = ("H100-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-180GB")
# (label, m, n, k): Llama-3.1-8B's fused QKV projection at decode and prefill sizes, its FFN up-projection
DEMO_GEMMS = [("qkv decode b=1", 1, 6144, 4096), ("qkv decode b=64", 64, 6144, 4096),
              ("qkv prefill 4k", 4096, 6144, 4096), ("ffn-up decode b=64", 64, 28672, 4096),
              ("ffn-up prefill 4k", 4096, 28672, 4096)]
DEMO_ALLREDUCE = [(2, 64 * 4096 * 2), (8, 64 * 4096 * 2), (8, 4096 * 4096 * 2)]
# (label, sequences, new tokens each, cached tokens each): one layer's attention core of Llama-3.1-8B
DEMO_ATTENTION = [("attention decode", 32, 1, 4095), ("attention prefill", 1, 4096, 0)]


def screen(model: str, dev: dict, n: int, repeat: int, rng) -> tuple[float, object, object]:
    tp = rng.choice([1.0, 2.0, 4.0, 8.0], n)
    b = rng.integers(1, 512, n).astype(float)
    ctx = rng.integers(128, 32768, n).astype(float)
    s = fw.shape(model)
    fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency(), dev, tp=tp[:8], dec_seqs=b[:8],
                           dec_ctx=ctx[:8])
    best, wall = float("inf"), float("inf")
    for _ in range(repeat):
        with fw.ledger() as led, M.fallbacks() as fb:
            t0, c0 = time.perf_counter(), time.process_time()
            fw.colocated_pass_time(s, fw.Precision(), fw.Efficiency(), dev, tp=tp, dec_seqs=b, dec_ctx=ctx)
            best = min(best, time.process_time() - c0)
            wall = min(wall, time.perf_counter() - t0)
    return n / best, n / wall, led, fb


def demo(eff: fw.Efficiency) -> None:
    print("\nmeasured vs roofline (default Efficiency: compute 0.6, bandwidth 0.8, link 0.7), bf16, "
          "microseconds")
    print(f"{'gpu':16} {'operator':22} {'m':>6} {'n':>6} {'k':>5} {'roofline':>9} {'measured':>9} "
          f"{'ratio':>6}")
    for gpu in DEMO_GPUS:
        g = specs.gpu(gpu)
        folder = M.DEVICE_TABLES[gpu][0]
        for label, m, n, k in DEMO_GEMMS:
            f, by = roofline.gemm(m, n, k)
            op = fw.Op("gemm", {"m": m, "n": n, "k": k}, f, by, g.flops("bf16"), g["hbm_bandwidth"])
            roof = float(fw.roofline_backend(op, eff)[0])
            meas, code = M.gemm_seconds(folder, m, n, k)
            ms = f"{float(meas) * 1e6:9.1f}" if code == 0 else f"{'(' + M.REASONS[int(code)][:7] + ')':>9}"
            ratio = f"{float(meas) / roof:6.2f}" if code == 0 else ""
            print(f"{gpu:16} {label:22} {m:6d} {n:6d} {k:5d} {roof * 1e6:9.1f} {ms} {ratio}")
        s = fw.shape("Llama-3.1-8B")  # 32 query heads, 8 KV heads of 128 on one GPU
        for label, b, new, cached in DEMO_ATTENTION:
            pairs = b * (new * cached + new * (new + 1) / 2)
            pf = s.pair_flops_decode if new == 1 else s.pair_flops_prefill
            op = fw.Op("attention", {}, pairs * pf, b * (cached + new) * s.kv_elems * 2.0, g.flops("bf16"),
                       g["hbm_bandwidth"])
            roof = float(fw.roofline_backend(op, eff)[0])
            meas, code = M.attention_seconds(folder, b, b * new, b * cached, 32, 8, 128)
            ms = f"{float(meas) * 1e6:9.1f}" if code == 0 else f"{'(none)':>9}"
            ratio = f"{float(meas) / roof:6.2f}" if code == 0 else ""
            what = f"batch {b}, {new} new, {cached} cached"
            print(f"{gpu:16} {label:22} {what:>20} {roof * 1e6:11.1f} {ms} {ratio}")
        dev = fw.instance_device(gpu)
        for ranks, msg in DEMO_ALLREDUCE:
            roof = 2.0 * (ranks - 1) / ranks * msg / (dev["link"] * eff.link) + eff.collective_latency_s
            meas, code = M.allreduce_seconds(folder, msg, ranks)
            ms = f"{float(meas) * 1e6:9.1f}" if code == 0 else f"{'(none)':>9}"
            print(f"{gpu:16} {'all-reduce ' + str(ranks) + ' GPUs':22} {msg:>20,} B {roof * 1e6:9.1f} {ms} "
                  f"{float(meas) / roof:6.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--target", type=float, default=1e6, help="plans/s the measured backend must reach")
    ap.add_argument("--gpu", default="H200-SXM-141GB")
    a = ap.parse_args(argv)
    print(f"{M.DISTRIBUTION} {M.package_version()}; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    M.table(M.DEVICE_TABLES[a.gpu][0], "gemm")
    M.table(M.DEVICE_TABLES[a.gpu][0], "allreduce")
    M.gemm_seconds(M.DEVICE_TABLES[a.gpu][0], 1.0, 64.0, 64.0)
    print(f"tables of {a.gpu} read and interpolation compiled (or loaded from numba's cache): "
          f"{time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    worst = float("inf")
    for model in ("Llama-3.1-8B", "Llama-3.1-70B"):
        roof_rate, roof_wall, _, _ = screen(model, fw.instance_device(a.gpu), a.plans, a.repeat, rng)
        rate, rate_wall, led, fb = screen(model, M.device(a.gpu), a.plans, a.repeat, rng)
        worst = min(worst, rate)
        share = np.asarray(led.measured_share)
        print(f"\n{model} decode on {a.gpu}, {a.plans:,} plans, per second of CPU time (of wall time): "
              f"roofline {roof_rate:,.0f} ({roof_wall:,.0f}) plans/s, measured {rate:,.0f} "
              f"({rate_wall:,.0f}) plans/s; measured share of the plans' time: mean {share.mean():.3f} "
              f"(min {share.min():.3f}, max {share.max():.3f})")
        for (dev, kind), (sec, cnt) in sorted(fb.measured.items()):
            print(f"  measured  {kind:9} {cnt:>10,} operator evaluations")
        for (dev, kind, reason), (sec, cnt) in sorted(fb.by_reason.items()):
            print(f"  roofline  {kind:9} {cnt:>10,} evaluations, {sec:10.3f} s of one instance each: "
                  f"{reason}")
    demo(fw.Efficiency())
    print("\ntables read (each once per process):")
    for r in M.tables_used():
        n = len(r["keys"])
        keys = ", ".join(r["keys"]) if n <= 6 else f"{n} (dtypes, heads, head sizes)"
        print(f"  {r['file']}  framework {r['framework']}, version {r['version']}, keys {keys}")
    info = M._table.cache_info()
    once = info.misses == len(M.tables_used())
    print(f"table cache: {info.misses} reads, {info.hits} hits")
    ok = worst >= a.target and once
    print(f"\nslowest measured screening {worst:,.0f} plans per CPU second, one thread "
          f"(target {a.target:,.0f}): {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
