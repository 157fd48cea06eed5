"""Devices a role can run on: a GPU of data/hardware.csv or a custom NPU design point of
data/npu_design_points.csv, reduced to the numbers the cost model needs (SI units)."""
from __future__ import annotations

import functools

import numpy as np

from .. import data, specs

DEFAULT_NET_BW = 50e9  # bytes/s per device of scale-out (400 Gbit/s NIC per GPU): an assumption


@functools.lru_cache(maxsize=1)
def _npus() -> dict:
    df = data.table("npu_design_points.csv")
    out = {}
    for _, r in df.iterrows():
        out[str(r["name"])] = {
            "name": str(r["name"]), "kind": "npu", "flops": float(r["tflops"]) * 1e12,
            "bw": float(r["hbm_tbps"]) * 1e12, "cap": float(r["hbm_gb"]) * 1e9,
            "link": float(r["link_gbps"]) * 1e9, "net": float(r["net_gbps"]) * 1e9,
            "price": float(r["price_usd"]), "attn_flops": float(r["tflops"]) * 1e12,
            "domain": float(r["scaleup_domain"]),
        }
    return out


def npu_names() -> list[str]:
    return list(_npus())


def names() -> list[str]:
    return specs.hardware_names("gpu") + npu_names()


def device(name: str, compute: str = "bf16", *, net_bw: float | None = None) -> dict:
    """The numbers of a device: ``flops`` (GEMM peak for the ``compute`` dtype; an NPU design point
    has a single peak), ``attn_flops`` (attention-core peak: bf16 on GPUs), ``bw``, ``cap`` (bytes),
    ``link`` (scale-up bytes/s per direction), ``domain`` (devices per scale-up domain), ``net``
    (scale-out bytes/s per device and direction: ``net_bw`` if given, else data/hardware.csv's
    ``scaleout_bandwidth``, else :data:`DEFAULT_NET_BW`), ``price`` (USD, NaN when unknown).
    Unknown names raise :class:`analysis.specs.UnknownNameError` listing GPUs and NPU design points
    (closest names first)."""
    if isinstance(name, dict):
        return name
    npus = _npus()
    if name in npus:
        d = dict(npus[name])
        if net_bw is not None:
            d["net"] = float(net_bw)
        return d
    if name not in specs.hardware_names("gpu"):
        raise specs.UnknownNameError("device (GPU or NPU design point)", name, names())
    g = specs.gpu(name)
    return {"name": name, "kind": "gpu", "flops": g.flops(compute), "attn_flops": g.flops("bf16"),
            "bw": g["hbm_bandwidth"],
            "cap": g["hbm_capacity"], "link": g.get("nvlink_bandwidth", g.get("pcie_bandwidth", 64e9)) / 2.0,
            "domain": float(g.get("scaleup_domain", 1.0)),
            "net": float(net_bw if net_bw is not None else g.get("scaleout_bandwidth", DEFAULT_NET_BW)),
            "price": float(g.get("price", float("nan")))}


PRICE_MODELS = ("linear", "power-law", "gpu-fit")
POWER_LAW = {"tflops": 0.5, "hbm_tbps": 0.5, "hbm_gb": 0.25}  # exponents: an ESTIMATE, declared here
POWER_LAW_ANCHOR = "NPU-1000T-64G"                             # priced at the H100 street price


def npu_prices(model: str = "linear") -> dict:
    """Estimated price (USD) of every NPU design point under a price model:

    * ``linear``: data/npu_design_points.csv's ``price_usd`` (a linear cost model, see that file);
    * ``power-law``: ``P = P_H100 * prod((x / x_anchor) ** e)`` over TFLOPS, HBM TB/s and HBM GB with
      the exponents :data:`POWER_LAW` (sub-linear: doubling a resource costs less than double),
      anchored at :data:`POWER_LAW_ANCHOR` (the H100-class point) = the H100 street price;
    * ``gpu-fit``: least squares of log street price on log dense FP8 TFLOPS, log HBM TB/s and log
      HBM GB over the GPUs of data/hardware.csv, applied to the design points (an extrapolation
      below 200 and above 10,000 TFLOPS)."""
    if model not in PRICE_MODELS:
        raise ValueError(f"unknown price model {model!r}; use one of {PRICE_MODELS}")
    df = data.table("npu_design_points.csv").set_index("name")
    if model == "linear":
        return {n: float(r["price_usd"]) for n, r in df.iterrows()}
    h100 = float(specs.gpu("H100-SXM5-80GB")["price"])
    if model == "power-law":
        a = df.loc[POWER_LAW_ANCHOR]
        return {n: h100 * float(np.prod([(r[k] / a[k]) ** e for k, e in POWER_LAW.items()]))
                for n, r in df.iterrows()}
    rows = []
    for g in specs.hardware_names("gpu"):
        sp = specs.gpu(g)
        if sp.get("price") is None:
            continue
        rows.append((np.log(sp.flops("fp8") / 1e12), np.log(sp["hbm_bandwidth"] / 1e12),
                     np.log(sp["hbm_capacity"] / 1e9), np.log(sp["price"])))
    X = np.array([[1.0, *r[:3]] for r in rows])
    coef, *_ = np.linalg.lstsq(X, np.array([r[3] for r in rows]), rcond=None)
    return {n: float(np.exp(coef @ [1.0, np.log(r["tflops"]), np.log(r["hbm_tbps"]), np.log(r["hbm_gb"])]))
            for n, r in df.iterrows()}
