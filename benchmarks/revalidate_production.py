"""Issue 27 item 4 (part): the production validation cells priced by the roofline and by the measured
kernel tables, at the declared two-micro-batch overlap and at perfect overlap, stated efficiencies.

    python benchmarks/revalidate_production.py [--skip-gains]

Prints decode tokens/s per GPU of StepFun's cells (Step-3 AFD, DeepSeek-V3 EP decode, Step-3 EP decode on
H800, up to 256 GPUs; published: 4,039 and 2,324), MegaScale-Infer's AFD-over-EP gain (Mixtral-8x22B and
DBRX on A800, BF16, up to 64 GPUs; published up to 1.28x) and DistServe's PD goodput gain (OPT-13B on
A100 with ShareGPT's per-request lengths, and at the mean lengths; published 2.0-4.6x). The declared
overlap applies to the colocated two-micro-batch overlap and to the attention/FFN ring
(analysis.disagg.search.af_layer_time) alike, by the one rule analysis.forward.pipelined.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.disagg import production as P  # noqa: E402
from analysis.forward import Efficiency  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-gains", action="store_true", help="StepFun cells only")
    a = ap.parse_args(argv)
    for backend in ("roofline", "measured"):
        for overlap in (Efficiency().overlap, 1.0):
            eff = Efficiency(overlap=overlap)
            tag = f"{backend:8s} overlap {overlap:.2f}"
            t = {f"{m} {md}": P.decode_throughput(m, "H800-SXM5-80GB", md, budget=256, eff=eff,
                                                   backend=backend)["tokens_per_s_per_device"]
                 for m, md in (("Step-3", "AFD"), ("DeepSeek-V3", "D"), ("Step-3", "D"))}
            err = (f"DeepSeek-V3 {t['DeepSeek-V3 D'] / 2324 - 1:+.0%}, "
                   f"Step-3 AFD {t['Step-3 AFD'] / 4039 - 1:+.0%}")
            print(tag, "  ".join(f"{k} {v:,.0f}" for k, v in t.items()), f"  {err},",
                  "AFD above D" if t["Step-3 AFD"] > t["Step-3 D"] else "AFD below D", flush=True)
            if a.skip_gains:
                continue
            for model in ("Mixtral-8x22B", "DBRX"):
                kw = dict(precision="bf16", budget=64, context=650.5, tpot_slo_s=0.15, eff=eff,
                          backend=backend)
                r = {md: P.decode_throughput(model, "A800-SXM4-80GB", md, **kw)["tokens_per_s_per_device"]
                     for md in ("D", "AFD")}
                print(f"{tag} MegaScale-Infer {model}: AFD/D {r['AFD'] / r['D']:.2f}x", flush=True)
    if not a.skip_gains:
        for lengths in ("sharegpt", "means"):
            g = P.distserve_gain(lengths=lengths)
            print(f"roofline DistServe ({lengths}): {g['gain']:.2f}x, PD candidates {g['PD_candidates']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
