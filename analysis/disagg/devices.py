"""Devices a role can run on: a GPU of data/hardware.csv or a custom NPU design point of
data/npu_design_points.csv, reduced to the numbers the cost model needs (SI units)."""
from __future__ import annotations

import functools

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
        }
    return out


def npu_names() -> list[str]:
    return list(_npus())


def names() -> list[str]:
    return specs.hardware_names("gpu") + npu_names()


def device(name: str, compute: str = "bf16", *, net_bw: float = DEFAULT_NET_BW) -> dict:
    """The numbers of a device: ``flops`` (GEMM peak for the ``compute`` dtype; an NPU design point
    has a single peak), ``attn_flops`` (attention-core peak: bf16 on GPUs), ``bw``, ``cap`` (bytes), ``link`` (scale-up bytes/s per direction), ``net``
    (scale-out bytes/s), ``price`` (USD, NaN when unknown). Unknown names raise
    :class:`analysis.specs.UnknownNameError` listing GPUs and NPU design points."""
    if isinstance(name, dict):
        return name
    npus = _npus()
    if name in npus:
        return dict(npus[name])
    if name not in specs.hardware_names("gpu"):
        raise specs.UnknownNameError("device (GPU or NPU design point)", name, names())
    g = specs.gpu(name)
    return {"name": name, "kind": "gpu", "flops": g.flops(compute), "attn_flops": g.flops("bf16"),
            "bw": g["hbm_bandwidth"],
            "cap": g["hbm_capacity"], "link": g.get("nvlink_bandwidth", g.get("pcie_bandwidth", 64e9)) / 2.0,
            "net": float(net_bw), "price": float(g.get("price", float("nan")))}
