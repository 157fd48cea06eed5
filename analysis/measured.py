"""A measured operator backend for :mod:`analysis.forward`: operator seconds read from the per-GPU
silicon tables of AIConfigurator (the ``aiconfigurator-core`` package, Apache-2.0, pinned to
:data:`PACKAGE_VERSION` in requirements.txt), with the roofline wherever the tables have no entry.

Tables
------
The package ships parquet tables under ``aiconfigurator_core/systems/data/<gpu>/<op>/<framework>/
<version>/``; latencies are in milliseconds per kernel call. They are read as installed package data,
once per process (lazily, at the first operator priced on that GPU, and cached), each through
:func:`table`, which records the file, framework and version it used (:func:`tables_used`). The
framework is a choice (:data:`DEFAULT_FRAMEWORK`, TensorRT-LLM: the framework whose tables cover
every GPU below); the version is the newest folder of that framework that holds the table
(:func:`packaging.version.Version` order). A missing table file, an unreadable (corrupt) one, one
without the expected columns, or one with a non-positive or non-finite latency is a
:class:`TableError` naming the file.

Devices
-------
:data:`DEVICE_TABLES` maps the GPUs of ``data/hardware.csv`` to the package's GPU folders,
explicitly. A800 and H800 are the A100 and H100 chips with a cut-down NVLink (400 GB/s): their compute
operators use A100's / H100's tables, and their communication operators are priced by the roofline on
their own links (the A100 / H100 all-reduce tables measured 600 / 900 GB/s NVLink), each such
fallback recorded with that reason. Any other device (the NPU design points of chapter 3, a GPU
without a folder) gets a backend that prices every operator by the roofline, reason recorded.

Operators covered (item 1 of issue 27)
---------------------------------------
* ``gemm`` (``m, n, k`` of :class:`analysis.forward.Op`, compute dtype ``bf16``/``fp8``/``fp4`` ->
  the table's ``bfloat16``/``fp8``/``nvfp4``): ``gemm_perf``.
* ``allreduce`` (message ``bytes`` per device, ``n`` ranks): the framework's custom all-reduce table
  (``custom_allreduce_perf``, bf16), at exactly the GPU counts it measured (2, 4, 8; 16 on some
  GB300 tables); ``n = 1`` is no operator (0 s, not counted as measured or fallback).
* ``attention`` when the operator's shape carries ``heads`` (query heads on the device) and
  ``head_dim`` (optionally ``window``, ``kv_dtype``, and ``family = "mla"`` to mark MLA, which falls
  back): a decode pass from ``generation_attention_perf`` at ``(batch, step = kv_tokens / batch)``, a
  prefill without a cached prefix from ``context_attention_perf`` at ``(batch, isl = tokens /
  batch)``; a mixed pass or a prefill after a prefix falls back. :mod:`analysis.forward` does not pass
  ``heads``/``head_dim`` yet, so its attention falls back with that reason until it does.
* ``moe`` (issue 27 item 2; :func:`moe_seconds`): the routed experts of one layer on the busiest GPU
  from the framework's MoE table (``moe_perf``; keys dtype, hidden, intermediate, top-k, experts; the
  balanced distribution, expert tensor parallel 1) at ``(tokens * moe_imbalance, EP size)``, each
  shape from the newest version folder that measured it (:func:`merged_table`); FP8 reads the
  block-scaled ``fp8_block`` table first. Shapes (and EP sizes) the MoE table lacks (GLM-4.6, Step-3,
  DBRX) are priced by efficiency transfer from the measured shapes of the same dtype on the same GPU
  (:func:`moe_transfer_seconds`: each measured shape's roofline over measured seconds at the same
  tokens per routed expert and EP size, weighted by shape similarity), reason code
  :data:`TRANSFERRED` (16): derived from the tables, not a measured point, so it is left out of the
  measured share and recorded with that reason. Chosen by leave-one-shape-out
  (:func:`moe_transfer_validation`) over the per-expert GEMM sum (:func:`expert_gemm_seconds`, median
  relative error 0.62 against 0.08, largest at decode token counts), which now prices only points beyond
  every measured shape's tokens or EP sizes (counted as measured, as before). The shared
  experts and the router stay on the roofline at the stated efficiencies, so a MoE operator's
  measured share is its routed part. This carries the low efficiency of expert GEMMs at few tokens
  per expert, the effect attention/FFN disaggregation (Step-3 AFD, MegaScale-Infer) exists for.
* ``alltoall`` (:func:`deepep_seconds`): SGLang's DeepEP low-latency dispatch + combine table
  (``wideep_deepep_ll_perf``) by tokens per rank at exactly the measured node count (``ceil(n / 8)``
  8-GPU nodes: H100 and H200 measured 1, 2, 4 and 8 nodes for DeepSeek-V3's shape, B200/B300 one),
  hidden size, top-k and experts, read at ``tokens * moe_imbalance``. EP144 (18 nodes), NVL72 racks,
  other shapes, prefill-sized token counts and chips measured on another's links fall back to the
  roofline (which also carries the imbalance), reason recorded.
* every other kind (``state``, ``p2p``) falls back to the roofline with a reason.

Interpolation
-------------
Each table becomes a regular grid over its numeric axes (GEMM: ``m, n, k`` per dtype; all-reduce:
message size per GPU count) of ``log(latency)`` (repeated measurements: the mean of their logs),
with NaN where the table has no row. A query is multilinear in ``log`` of every continuous axis
between the two bracketing grid values of each axis (log-log linear in ``m`` at fixed ``n, k``, and
the same in ``n`` and ``k``); a discrete axis (GPU count) must match a measured value exactly. A
table point is therefore reproduced exactly, and the interpolant is monotone in ``m`` wherever the
measured latencies are (the raw GEMM tables are not monotone everywhere: tile quantisation makes
``m = 4097`` slower than ``m = 4352`` on some shapes, and the interpolant follows the table). A query
outside the measured range of any axis, or whose bracketing cell has a grid point without a row,
falls back to the roofline. Everything is numpy-vectorised over the candidate plans: shapes in
(arrays), seconds out.

Measured seconds replace the efficiency-scaled roofline: :class:`analysis.forward.Efficiency`'s
``compute``, ``bandwidth``, ``link`` and ``collective_latency_s`` do not apply to a measured operator
(the table already holds what the kernel achieved); the per-step and per-layer overheads still do.

Use
---
``measured.device(name, prec)`` is the device dict of :func:`analysis.forward.instance_device` with
the backend ``"measured:<name>"`` (``"measured:<name>+weight-only"`` for weights stored in fewer bytes
than the compute dtype, e.g. int4 with bf16 math: an operator carries only its compute dtype, so those
GEMMs fall back rather than read the bf16 table). A backend is registered per device
(:func:`backend_name`; the :class:`analysis.forward.Op` of an operator carries no device name, so the
device is in the backend's name), for every GPU of :data:`DEVICE_TABLES` when this module is
imported and on demand for any other. :func:`analysis.forward.ledger` then reports the share of a
plan's time that came from the tables; :func:`fallbacks` records, per (device, operator kind,
reason), the seconds and the number of plan-operator evaluations priced by the roofline instead. The
roofline stays every chapter's default.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit
from packaging.version import InvalidVersion, Version

from . import forward

PACKAGE = "aiconfigurator_core"
DISTRIBUTION = "aiconfigurator-core"
PACKAGE_VERSION = "0.12.0"
DEFAULT_FRAMEWORK = "trtllm"

# device of data/hardware.csv -> (GPU folder of the package, communication tables apply, note)
DEVICE_TABLES: dict[str, tuple[str, bool, str]] = {
    "A100-SXM4-80GB": ("a100_sxm", True, ""),
    "A800-SXM4-80GB": ("a100_sxm", False, "A800 = A100 with 400 GB/s NVLink: A100's compute tables; "
                       "communication on A800's own links (roofline)"),
    "H100-SXM5-80GB": ("h100_sxm", True, ""),
    "H800-SXM5-80GB": ("h100_sxm", False, "H800 = H100 with 400 GB/s NVLink: H100's compute tables; "
                       "communication on H800's own links (roofline)"),
    "H200-SXM-141GB": ("h200_sxm", True, ""),
    "B200-SXM-180GB": ("b200_sxm", True, ""),
    "B300-SXM-288GB": ("b300_sxm", True, ""),
    "GB200-NVL72": ("gb200", True, ""),
    "GB300-NVL72": ("gb300", True, ""),
}

# forward's compute dtype -> the GEMM table's gemm_dtype
GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4"}

# (operator folder, file stem, numeric axes, discrete axes, key columns) per table kind
_ATTN_KEYS = ("attn_dtype", "kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim", "window_size")
TABLE_KINDS = {
    "gemm": ("gemm", "gemm_perf", ("m", "n", "k"), (), ("gemm_dtype",)),
    # routed experts of one MoE layer on one GPU: global tokens entering the layer, EP size
    "moe": ("moe", "moe_perf", ("num_tokens", "moe_ep_size"), (),
            ("moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "distribution", "moe_tp_size")),
    # SGLang's wide-EP decode MoE (DeepEP + DeepGEMM masked grouped GEMM): global tokens, EP size
    "moe_wideep": ("moe", "wideep_generation_moe_perf", ("num_tokens", "moe_ep_size"), (),
                   ("moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "distribution",
                    "moe_tp_size")),
    # DeepEP low-latency dispatch + combine: tokens per rank, at a node count (8 GPUs a node)
    "deepep_ll": ("comm", "wideep_deepep_ll_perf", ("num_token",), (),
                  ("node_num", "hidden_size", "num_topk", "num_experts")),
    "allreduce": ("comm", "custom_allreduce_perf", ("num_gpus", "message_size"), (), ("allreduce_dtype",)),
    "context_attention": ("attention", "context_attention_perf", ("batch_size", "isl"), (), _ATTN_KEYS),
    "generation_attention": ("attention", "generation_attention_perf", ("batch_size", "step"), (),
                             _ATTN_KEYS),
}

# reasons, one code each (0: measured)
MEASURED, NO_OP = 0, 1
REASONS = {
    2: "no table for this device",
    3: "operator kind not covered by the measured tables yet",
    4: "compute dtype has no table",
    5: "outside the table's measured range",
    6: "the table has no row at a bracketing grid point",
    7: "GPU count not measured",
    8: "communication on this device's own links (its tables measured another chip's links)",
    9: "no table for these heads, KV heads, head size, window or dtypes",
    10: "a pass mixing prefill and decode, or a prefill after a cached prefix: no table",
    11: "MLA attention: the MLA tables are not mapped yet",
    12: "weight-only quantised GEMM (weights smaller than the compute dtype): no table mapped",
    13: "no DeepEP table for this node count, hidden size, top-k or expert count",
    14: "DeepEP tables: NVL72 node layout not mapped (the tables count 8-GPU nodes)",
    15: "all-to-all beyond one scale-up domain without a scale-out layout (domain unknown)",
    16: "MoE shape not measured: priced by the efficiency of the measured MoE shapes transferred at the same "
        "tokens per expert and EP size (moe_transfer_seconds; derived from the tables, not a measured point)",
}
TRANSFERRED = 16  # a MoE price derived from the MoE tables, not a measured point: not in the measured share

# forward's compute dtype -> the MoE table's moe_dtype, in order of preference (FP8 models such as
# DeepSeek-V3 and Step-3 ship block-scaled FP8 weights: fp8_block first, per-tensor fp8 second)
MOE_DTYPES = {"bf16": ("bfloat16",), "fp16": ("bfloat16",), "fp8": ("fp8_block", "fp8"), "fp4": ("nvfp4",)}
MOE_DISTRIBUTION = "balanced"  # the load imbalance is forward's moe_imbalance, applied to the tokens
DEEPEP_FRAMEWORK = "sglang"    # the DeepEP tables are SGLang's (wide-EP) measurements
GPUS_PER_NODE = 8              # DeepEP's node_num counts 8-GPU HGX nodes
DEEPEP_FOLDERS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm")  # 8-GPU boards (not NVL72 racks)
# Wide expert parallelism (EP across nodes) runs DeepEP's dispatch with DeepGEMM's masked grouped GEMM
# (DeepSeek's and SGLang's decode): from this EP size on, the MoE operator reads SGLang's wide-EP
# generation table where it has the shape and the point, TensorRT-LLM's fused-MoE table otherwise.
WIDE_EP_MIN = 16
KIND_REASONS = {
    "attention": "attention: the tables are keyed on query heads and head size, which forward.Op does not "
                 "carry yet (shape keys heads, head_dim; issue 27 item 2)",
    "moe": "moe: the operator does not carry the expert shape (hidden, inter)",
    "state": "state (linear attention): no table mapped yet",
    "alltoall": "alltoall: the operator does not carry tokens, hidden size, top-k and experts",
    "p2p": "p2p (activation hops, context parallelism, KV transfer): no table",
}


class TableError(RuntimeError):
    """A measured table is missing, unreadable or malformed; the message names the file."""


# ------------------------------------------------------------------------------------------ tables


def data_root() -> Path:
    """The installed package's ``systems/data`` folder (an error saying how to install it if absent)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TableError(f"the measured backend needs {DISTRIBUTION}=={PACKAGE_VERSION} (pinned in "
                         "requirements.txt): run `make install`")
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def package_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _version_key(v: str):
    try:
        return (1, Version(v))
    except InvalidVersion:
        return (0, Version("0"))


def table_path(folder: str, kind: str, framework: str = DEFAULT_FRAMEWORK, root: Path | None = None) -> Path:
    """The parquet file of table ``kind`` for a GPU folder: the newest version of ``framework`` that
    has it. A :class:`TableError` names the folder searched when there is none."""
    op, stem, *_ = TABLE_KINDS[kind]
    base = (data_root() if root is None else Path(root)) / folder / op / framework
    versions = sorted((p.parent.name for p in base.glob(f"*/{stem}.parquet")), key=_version_key)
    if not versions:
        raise TableError(f"no measured table {base}/<version>/{stem}.parquet")
    return base / versions[-1] / f"{stem}.parquet"


@dataclass(frozen=True)
class Grid:
    """``log(latency in s)`` on the regular grid of a table's axes (NaN where the table has no row)."""

    axes: tuple          # log of each axis's values, sorted
    values: np.ndarray   # log latency, one dimension per axis

    def at(self, *idx) -> float:
        """The stored log latency at integer grid indices (NaN where the table has no row)."""
        return float(self.values[idx])


@dataclass(frozen=True)
class Table:
    """One measured table: its file, framework, version and one :class:`Grid` per key value
    (dtype, or (dtype, GPU count) for discrete axes)."""

    path: Path
    kind: str
    framework: str
    version: str
    grids: dict
    key_versions: dict | None = None  # merged tables (:func:`merged_table`): the version of each key

    def grid(self, key) -> Grid | None:
        return self.grids.get(key)


_USED: dict[Path, Table] = {}


def load(path: Path, kind: str) -> Table:
    """Read one table file into grids (no caching: :func:`table` caches). Every failure is a
    :class:`TableError` naming ``path``."""
    path = Path(path)
    op, stem, cont, disc, key = TABLE_KINDS[kind]
    if not path.is_file():
        raise TableError(f"measured table {path} is missing: reinstall {DISTRIBUTION}=={PACKAGE_VERSION}")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise TableError(f"measured table {path} cannot be read ({type(e).__name__}: {e}); "
                         f"reinstall {DISTRIBUTION}=={PACKAGE_VERSION}") from e
    if kind == "deepep_ll" and {"dispatch_avg_t_us", "combine_avg_t_us"} <= set(df.columns):
        df = df.assign(latency=(df["dispatch_avg_t_us"] + df["combine_avg_t_us"]) * 1e-3)  # us -> ms
    need = {"framework", "version", "latency", *key, *cont, *disc}
    missing = sorted(need - set(df.columns))
    if missing:
        raise TableError(f"measured table {path} lacks the columns {missing}")
    if "op_name" in df.columns and kind == "allreduce":
        df = df[df["op_name"] == "all_reduce"]
    lat = df["latency"].to_numpy(dtype=float)
    if len(df) == 0 or not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise TableError(f"measured table {path} has no rows or a non-finite or non-positive latency")
    fv = df[["framework", "version"]].astype(str).drop_duplicates()  # the distinct pairs, then as before
    fw_ver = sorted(set(zip(fv["framework"], fv["version"])))
    df = df.assign(_loglat=np.log(lat * 1e-3))  # ms -> s
    return Table(path, kind, fw_ver[0][0] if len(fw_ver) == 1 else str(fw_ver), path.parent.name,
                 _grids(df, [*key, *disc], list(cont)))


def _scalar(v):
    """A key value as a groupby's iteration gives it (Python scalars, not numpy's)."""
    return v.item() if isinstance(v, np.generic) else v


def _grids(df: pd.DataFrame, outer: list, cont: list) -> dict:
    """One :class:`Grid` per value of the ``outer`` columns (keys in sorted order): the mean of
    ``_loglat`` at every measured point of the ``cont`` axes (repeated measurements: mean of logs),
    each axis the sorted values measured under that key. One grouped mean over all the columns (a
    group's mean does not depend on the other groups), cut into the keys' contiguous blocks."""
    full = df.groupby([*outer, *cont], sort=True)["_loglat"].mean()
    idx = full.index if len(outer) + len(cont) > 1 else pd.MultiIndex.from_arrays([full.index])
    vals_all = full.to_numpy()
    no, n = len(outer), len(full)
    codes = [np.asarray(c) for c in idx.codes]
    new_key = np.zeros(n, dtype=bool)
    if n:
        new_key[0] = True
    for c in codes[:no]:
        new_key[1:] |= c[1:] != c[:-1]
    starts = np.flatnonzero(new_key)
    ends = np.append(starts[1:], n)
    grids = {}
    for a, b in zip(starts, ends):
        k = tuple(_scalar(idx.levels[j][codes[j][a]]) for j in range(no))
        axes, at = [], []
        for j in range(no, no + len(cont)):
            c = codes[j][a:b]
            used = np.unique(c)  # the level's values measured under this key, sorted
            axes.append(np.log(np.asarray(idx.levels[j][used], dtype=float)))
            at.append(np.searchsorted(used, c))
        vals = np.full(tuple(len(x) for x in axes), np.nan)
        vals[tuple(at)] = vals_all[a:b]
        grids[k] = Grid(tuple(axes), vals)
    return grids


def table(folder: str, kind: str, framework: str = DEFAULT_FRAMEWORK) -> Table:
    """The table ``kind`` of a GPU folder, read once per process and recorded in :func:`tables_used`."""
    return _table(folder, kind, framework)


@functools.lru_cache(maxsize=None)
def _table(folder: str, kind: str, framework: str) -> Table:
    p = table_path(folder, kind, framework)
    t = load(p, kind)
    _USED[p] = t
    return t


@functools.lru_cache(maxsize=None)
def merged_table(folder: str, kind: str, framework: str = DEFAULT_FRAMEWORK) -> Table:
    """Table ``kind`` of a GPU folder merged over every version folder of ``framework`` that has it:
    each key (dtype and shape) from the newest version that measured it (the MoE and DeepEP tables
    spread their shapes over versions: H100's newest TensorRT-LLM MoE table holds four shapes, the one
    before it fifty). Each file read is recorded in :func:`tables_used`; the merged table's ``version``
    lists the versions it took keys from, ``key_versions`` which key came from which."""
    op, stem, *_ = TABLE_KINDS[kind]
    base = data_root() / folder / op / framework
    versions = sorted((p.parent.name for p in base.glob(f"*/{stem}.parquet")), key=_version_key, reverse=True)
    if not versions:
        raise TableError(f"no measured table {base}/<version>/{stem}.parquet")
    grids, kv = {}, {}
    for v in versions:
        p = base / v / f"{stem}.parquet"
        if p not in _USED:
            _USED[p] = load(p, kind)
        for k, g in _USED[p].grids.items():
            if k not in grids:
                grids[k], kv[k] = g, v
    used = [v for v in versions if v in kv.values()]
    return Table(base / versions[0] / f"{stem}.parquet", kind, framework, ", ".join(used), grids, kv)


def tables_used() -> list[dict]:
    """Every table read in this process: device folder, operator, framework (as the file says),
    version folder, rows of each key, file."""
    root = None
    with contextlib.suppress(TableError):
        root = data_root()
    out = []
    for p, t in sorted(_USED.items()):
        rel = p.relative_to(root) if root is not None and p.is_relative_to(root) else p
        out.append({"gpu": rel.parts[0] if root is not None else "", "kind": t.kind, "framework": t.framework,
                    "version": t.version, "keys": sorted("/".join(map(str, k)) for k in t.grids),
                    "file": str(rel)})
    return out


# ----------------------------------------------------------------------------------- interpolation


@njit(cache=True)
def _interp_kernel(X, ax_cat, ax_off, ax_len, strides, flat, out, code):  # pragma: no cover (numba)
    """Multilinear interpolation of ``flat`` (log latency, row-major grid) at the rows of ``X`` (logs,
    one column per axis): per row, a binary search per axis for the lower bracketing value, then the
    ``2^D`` bracketing points weighted by the products of the per-axis weights; a point with weight 0
    is never read (so an exact table point needs no neighbour). ``code``: 5 outside, 6 hole."""
    n, d = X.shape
    lo = np.empty(d, np.int64)
    w = np.empty(d)
    for j in range(n):
        c = 0
        for a in range(d):
            x = X[j, a]
            o = ax_off[a]
            L = ax_len[a]
            if not (x >= ax_cat[o] and x <= ax_cat[o + L - 1]):
                c = 5
                break
            i0 = 0  # branch-free binary search: the last axis value <= x
            length = L
            while length > 1:
                half = length // 2
                i0 = i0 + half if ax_cat[o + i0 + half] <= x else i0
                length -= half
            lo[a] = i0
            w[a] = 0.0 if i0 == L - 1 else (x - ax_cat[o + i0]) / (ax_cat[o + i0 + 1] - ax_cat[o + i0])
        if c == 0:
            acc = 0.0
            for corner in range(1 << d):
                wc = 1.0
                for a in range(d):
                    wc *= w[a] if (corner >> (d - 1 - a)) & 1 else 1.0 - w[a]
                if wc > 0.0:
                    f = 0
                    for a in range(d):
                        f += (lo[a] + ((corner >> (d - 1 - a)) & 1)) * strides[a]
                    v = flat[f]
                    if np.isnan(v):
                        c = 6
                        break
                    acc += wc * v
        code[j] = c
        out[j] = np.exp(acc) if c == 0 else np.nan


@njit(inline="always")
def _lower(ax, x):  # pragma: no cover (numba)
    """Index of the last value of the sorted ``ax`` that is <= ``x`` (``ax[0] <= x``), branch-free."""
    i = 0
    length = ax.shape[0]
    while length > 1:
        half = length // 2
        i = i + half if ax[i + half] <= x else i
        length -= half
    return i


@njit(cache=True)
def _interp_kernel2(X, a0, a1, vals, out, code):  # pragma: no cover (numba)
    """:func:`_interp_kernel` unrolled for two axes (the common case: a GEMM's ``m, n`` at one ``k``;
    an all-reduce's GPU count and message size)."""
    L0 = a0.shape[0]
    L1 = a1.shape[0]
    for j in range(X.shape[0]):
        u = X[j, 0]
        v = X[j, 1]
        if not (u >= a0[0] and u <= a0[L0 - 1] and v >= a1[0] and v <= a1[L1 - 1]):
            code[j] = 5
            out[j] = np.nan
            continue
        i = _lower(a0, u)
        k = _lower(a1, v)
        wu = 0.0 if i == L0 - 1 else (u - a0[i]) / (a0[i + 1] - a0[i])
        wv = 0.0 if k == L1 - 1 else (v - a1[k]) / (a1[k + 1] - a1[k])
        acc = (1.0 - wu) * (1.0 - wv) * vals[i, k]  # the lower corner always carries weight > 0
        if wv > 0.0:
            acc += (1.0 - wu) * wv * vals[i, k + 1]
        if wu > 0.0:
            acc += wu * (1.0 - wv) * vals[i + 1, k]
            if wv > 0.0:
                acc += wu * wv * vals[i + 1, k + 1]
        if np.isnan(acc):  # a bracketing point with weight > 0 has no row
            code[j] = 6
            out[j] = np.nan
        else:
            code[j] = 0
            out[j] = np.exp(acc)


_READS: contextvars.ContextVar = contextvars.ContextVar("measured_reads", default=None)


@contextlib.contextmanager
def reuse_reads():
    """Inside the ``with`` block, :func:`interpolate` returns the result of an identical earlier read
    (the same table grid, the same points) instead of recomputing it: for a caller that prices the same
    operator shapes many times, as a calibration fit does (its efficiencies change only the roofline's
    fallback prices, never a table read). Results are identical; the memo ends with the block."""
    tok = _READS.set({})
    try:
        yield
    finally:
        _READS.reset(tok)


def interpolate(grid: Grid, points) -> tuple[np.ndarray, np.ndarray]:
    """``(seconds, code)`` at ``points`` (one array per axis of ``grid``, broadcast together; values
    in the axis units, not logs): multilinear in the logs between the bracketing grid values of every
    axis; ``code`` is 0 where interpolated, 5 outside an axis's range, 6 where a bracketing grid point
    with non-zero weight has no row (seconds NaN at both).

    An axis queried at one value for every plan (a scalar, e.g. ``k = hidden``) is interpolated on
    the grid first (grid-sized work); the per-plan work (a compiled loop, :func:`_interp_kernel`) is
    multilinear over the other axes only."""
    memo = _READS.get()
    if memo is None:
        return _interpolate(grid, points)
    pts = [np.asarray(p, dtype=float) for p in points]
    key = (id(grid), tuple((p.shape, p.tobytes()) for p in pts))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (grid, _interpolate(grid, pts))  # the grid is kept so that its id stays its own
    sec, code = hit[1]
    return sec.copy(), code.copy()


def _interpolate(grid: Grid, points) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interpolate` without the memo of :func:`reuse_reads`."""
    pts = [np.asarray(p, dtype=float) for p in points]
    shape = np.broadcast_shapes(*(p.shape for p in pts))
    vals, axes = grid.values, list(grid.axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        for d in reversed(range(len(axes))):
            if pts[d].size != 1 or len(axes) == 1:
                continue
            x, ax = float(np.log(pts[d].reshape(()))), axes[d]
            if not ax[0] <= x <= ax[-1]:
                return np.full(shape, np.nan), np.full(shape, 5, dtype=np.int8)
            i = min(int(np.searchsorted(ax, x, side="right")) - 1, len(ax) - 1)
            w = 0.0 if i == len(ax) - 1 else (x - ax[i]) / (ax[i + 1] - ax[i])
            vals = vals.take(i, axis=d) if w == 0.0 else (
                (1.0 - w) * vals.take(i, axis=d) + w * vals.take(i + 1, axis=d))
            del axes[d], pts[d]
        X = np.empty((int(np.prod(shape, dtype=np.int64)), len(axes)))
        for a, p in enumerate(pts):
            X[:, a] = np.log(np.broadcast_to(p, shape)).ravel()
    flat = np.ascontiguousarray(vals, dtype=float).ravel()
    strides = np.array([int(np.prod(vals.shape[j + 1:], dtype=np.int64)) for j in range(len(axes))], np.int64)
    lens = np.array([len(a) for a in axes], np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    out = np.empty(X.shape[0])
    code = np.empty(X.shape[0], dtype=np.int8)
    if len(axes) == 2:
        _interp_kernel2(X, axes[0], axes[1], np.ascontiguousarray(vals, dtype=float), out, code)
    else:
        _interp_kernel(X, np.concatenate(axes).astype(float), offs, lens, strides, flat, out, code)
    return out.reshape(shape), code.reshape(shape)


# --------------------------------------------------------------------------------------- operators


def gemm_seconds(folder: str, m, n, k, dtype: str = "bf16", framework: str = DEFAULT_FRAMEWORK):
    """Measured seconds of a GEMM ``(m, n, k)`` (arrays broadcast) and the reason code of each
    (0: measured; see :data:`REASONS`)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))  # not broadcast: a scalar axis is cheap
    g = table(folder, "gemm", framework).grid((GEMM_DTYPES.get(dtype, dtype),))
    if g is None:
        shape = np.broadcast_shapes(m.shape, n.shape, k.shape)
        return np.full(shape, np.nan), np.full(shape, 4, dtype=np.int8)
    return interpolate(g, (m, n, k))


def allreduce_seconds(folder: str, message_bytes, n, framework: str = DEFAULT_FRAMEWORK):
    """Measured seconds of an all-reduce of ``message_bytes`` per device over ``n`` GPUs (bf16; only
    at the GPU counts the table measured, no interpolation between counts) and the reason code of
    each; ``n <= 1`` is no operator (0 s, code 1)."""
    msg, n = np.broadcast_arrays(np.asarray(message_bytes, dtype=float), np.asarray(n, dtype=float))
    g = table(folder, "allreduce", framework).grid(("bfloat16",))
    if g is None:
        sec, code = np.full(msg.shape, np.nan), np.full(msg.shape, 4, dtype=np.int8)
    else:
        sec, code = interpolate(g, (n, msg))
        code = np.where(np.isin(n, np.round(np.exp(g.axes[0]))), code, 7).astype(np.int8)
        sec = np.where(code == 0, sec, np.nan)
    return np.where(n <= 1, 0.0, sec), np.where(n <= 1, NO_OP, code).astype(np.int8)


def attention_seconds(folder: str, batch, tokens, kv_tokens, heads, kv_heads, head_dim, window=0.0,
                      kv_dtype: str = "bf16", framework: str = DEFAULT_FRAMEWORK):
    """Measured seconds of one layer's attention core on one device and the reason code of each plan:
    ``batch`` sequences, ``tokens`` new tokens, ``kv_tokens`` cached tokens read, ``heads`` query heads
    and ``kv_heads`` KV heads on the device, ``head_dim``, sliding ``window`` (0: none). A decode pass
    (one new token per sequence) reads the generation table at ``step = kv_tokens / batch``; a prefill
    without a cached prefix the context table at ``isl = tokens / batch``; both interpolated log-log
    in (batch, length) at exactly the table's heads, KV heads, head size, window and dtypes (attention
    in bf16, the KV cache in ``kv_dtype``). A mixed pass or a prefill after a prefix falls back."""
    arrs = np.broadcast_arrays(*[np.asarray(x, dtype=float)
                                 for x in (batch, tokens, kv_tokens, heads, kv_heads)])
    shape = arrs[0].shape
    b, t, kvt, h, kvh = (x.ravel() for x in arrs)
    sec = np.full(b.shape, np.nan)
    code = np.full(b.shape, 10, dtype=np.int8)
    dec = (t == b) & (b > 0)
    pre = (kvt == 0) & (t > b) & (b > 0)
    kvd = GEMM_DTYPES.get(kv_dtype, kv_dtype)
    combos, inv = np.unique(h * 65536.0 + kvh, return_inverse=True)
    for i, c in enumerate(combos):
        sel = inv == i
        for kind, mask, length in (("generation_attention", dec, kvt / np.maximum(b, 1.0)),
                                   ("context_attention", pre, t / np.maximum(b, 1.0))):
            m = sel & mask
            if not m.any():
                continue
            key = ("bfloat16", kvd, int(c // 65536), int(c % 65536), int(head_dim), int(window))
            g = table(folder, kind, framework).grid(key) if float(c // 65536) == c // 65536 else None
            if g is None:
                code[m] = 9
                continue
            sec[m], code[m] = interpolate(g, (b[m], length[m]))
    return sec.reshape(shape), code.reshape(shape)


def moe_seconds(folder: str, tokens, ep, hidden, inter, topk, n_experts, dtype: str = "bf16",
                imbalance=1.0, framework: str = DEFAULT_FRAMEWORK, moe_tp=1):
    """Measured seconds of one MoE layer's routed experts on the busiest GPU of an expert-parallel
    group of ``ep`` GPUs (one expert-parallel rank per GPU, no expert tensor parallelism) for
    ``tokens`` tokens entering the layer across the group, and the reason code of each plan.

    The MoE table (TensorRT-LLM's fused MoE kernel: routing permute, grouped expert GEMMs, activation,
    finalize) is read at the balanced routing distribution and ``tokens * imbalance`` tokens: the
    busiest GPU sees ``imbalance`` times the mean load (:attr:`analysis.forward.Efficiency.moe_imbalance`),
    which a balanced kernel sees at that many tokens. Log-log interpolation in tokens and EP size
    (EP 144 between the measured 128 and 256). A shape (hidden, intermediate, top-k, experts) the table
    did not measure for the dtype is code 9; outside the measured tokens or EP sizes, code 5. From EP
    :data:`WIDE_EP_MIN` on, SGLang's wide-EP generation table (DeepEP + DeepGEMM, uniform routing) is
    read instead where it holds the shape and the point (H100/H200: DeepSeek-V3's shape in block FP8):
    at EP 128 and 16k tokens it measures about a third of TensorRT-LLM's fused-MoE latency, whose
    ranks each handle the global token set. ``moe_tp`` (a recorded run's expert tensor-parallel size,
    :func:`analysis.forward.moe_split`) reads the table's rows at that ``moe_tp_size`` (the table
    measures tensor-split experts without expert parallelism; a split it did not measure is code 9)."""
    tok = np.asarray(tokens, dtype=float) * np.asarray(imbalance, dtype=float)
    ep = np.asarray(ep, dtype=float)
    etp = np.asarray(moe_tp, dtype=float)
    shape = np.broadcast_shapes(tok.shape, ep.shape, etp.shape)
    sec, code = np.full(shape, np.nan), np.full(shape, 9, dtype=np.int8)
    t = merged_table(folder, "moe", framework)
    tok_b, ep_b, etp_b = (np.broadcast_to(x, shape) for x in (tok, ep, etp))
    for mt in np.unique(etp_b):
        sel = etp_b == mt
        for dt in MOE_DTYPES.get(dtype, (dtype,)):
            g = t.grid((dt, int(hidden), int(inter), int(topk), int(n_experts), MOE_DISTRIBUTION, int(mt)))
            if g is not None:
                sec[sel], code[sel] = interpolate(g, (tok_b[sel], ep_b[sel]))
                break
    wide = (ep_b >= WIDE_EP_MIN) & (etp_b == 1)
    if np.any(wide) and _has_wideep(folder):
        tw = merged_table(folder, "moe_wideep", DEEPEP_FRAMEWORK)
        for dt in MOE_DTYPES.get(dtype, (dtype,)):
            g = tw.grid((dt, int(hidden), int(inter), int(topk), int(n_experts), "uniform", 1))
            if g is not None:
                ws, wc = (np.broadcast_to(x, shape) for x in interpolate(g, (tok, ep)))
                use = wide & (wc == MEASURED)
                sec, code = np.where(use, ws, sec), np.where(use, wc, code).astype(np.int8)
                break
    return sec, code


@functools.lru_cache(maxsize=None)
def _has_wideep(folder: str) -> bool:
    stem = TABLE_KINDS["moe_wideep"][1]
    return any((data_root() / folder / "moe" / DEEPEP_FRAMEWORK).glob(f"*/{stem}.parquet"))


def expert_gemm_seconds(folder: str, tokens, experts, n_experts, topk, hidden, inter, gated=True,
                        dtype: str = "bf16", imbalance=1.0, framework: str = DEFAULT_FRAMEWORK):
    """Measured seconds of the routed experts on the busiest GPU priced as separate per-expert GEMMs
    from the GEMM table (for MoE shapes the MoE table did not measure): the ``e (1 - (1 - k/E)^T)``
    touched experts of the ``e = experts`` on the GPU each run an up-projection ``(m, 2 inter or inter,
    hidden)`` and a down-projection ``(m, hidden, inter)`` on ``m`` tokens, the GPU's
    ``T k e / E * imbalance`` routed token slots shared among its touched experts (at least one token).
    NOT a lower bound: it omits the permute and activation, but each small GEMM pays its own launch and
    low occupancy where the grouped kernel runs every expert in one launch: on the shapes the MoE table
    measured the sum is 0.46x-4.5x the measured fused-MoE time (10th-90th percentile; relative error
    median 0.62, p90 3.5, largest at decode token counts and in FP8: :func:`moe_transfer_validation`).
    Used only where :func:`moe_transfer_seconds` cannot price a point."""
    T = np.asarray(tokens, dtype=float)
    e = np.asarray(experts, dtype=float)
    touched = np.maximum(e * (1.0 - (1.0 - topk / n_experts) ** T), 1e-9)
    m = np.maximum(T * topk * e / n_experts * np.asarray(imbalance, dtype=float) / touched, 1.0)
    up, c1 = gemm_seconds(folder, m, (2.0 if gated else 1.0) * inter, hidden, dtype, framework)
    down, c2 = gemm_seconds(folder, m, hidden, inter, dtype, framework)
    return touched * (up + down), np.maximum(c1, c2)


# ---------------------------------------------------------- MoE shapes the table lacks: transfer


# bytes per weight element of each MoE table dtype (the roofline the efficiency is measured against)
MOE_WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5625}
# width (in natural-log units of hidden, intermediate, top-k and expert count) of the Gaussian weight
# of each measured shape in the transferred efficiency, chosen by leave-one-shape-out
# (moe_transfer_validation over VALIDATION_FOLDERS x VALIDATION_DTYPES, decode and prefill) before
# chapter 3's claims were recomputed (2026-12-03): of the candidates inf (equal weights), 1, 0.5,
# 0.35, 0.25 and 0.15, the smallest pooled 90th-percentile relative error (0.40; median 0.08; the
# per-expert GEMM sum: median 0.62, p90 3.5)
TRANSFER_SIGMA = 0.25


def moe_roofline_seconds(tokens, ep, hidden, inter, topk, n_experts, peak, bw, weight_bytes=2.0, gated=True,
                         act_bytes=2.0):
    """Roofline seconds of one MoE layer's routed experts on the busiest GPU of ``ep`` (balanced
    routing, ``tokens`` entering the layer across the group): ``e = ceil(E / ep)`` experts, ``T k e /
    E`` token slots, FLOPs ``2 * slots * (3 or 2) * hidden * inter`` (gated or not), bytes of the
    ``e (1 - (1 - k/E)^T)`` touched experts' weights plus each slot's input and output row; the larger
    of FLOPs / ``peak`` and bytes / ``bw`` (the same terms as :func:`analysis.forward.ffn_block`)."""
    T = np.asarray(tokens, dtype=float)
    e = np.ceil(n_experts / np.asarray(ep, dtype=float))
    slots = T * topk * e / n_experts
    mult = 3.0 if gated else 2.0
    touched = e * (1.0 - (1.0 - topk / n_experts) ** T)
    flops = 2.0 * slots * mult * hidden * inter
    byt = touched * mult * hidden * inter * weight_bytes + 2.0 * slots * hidden * act_bytes
    return np.maximum(flops / peak, byt / bw)


@functools.lru_cache(maxsize=None)
def moe_sources(folder: str, dtype: str, framework: str = DEFAULT_FRAMEWORK) -> tuple:
    """The measured MoE shapes a transfer reads: ``(table dtype, {(hidden, inter, topk, experts):
    grid})`` of the first dtype of :data:`MOE_DTYPES` with at least two shapes (balanced routing,
    expert tensor parallel 1), ``(None, {})`` where none has."""
    t = merged_table(folder, "moe", framework)
    for dt in MOE_DTYPES.get(dtype, (dtype,)):
        src = {k[1:5]: g for k, g in t.grids.items() if k[0] == dt and k[5] == MOE_DISTRIBUTION and k[6] == 1}
        if len(src) >= 2:
            return dt, src
    return None, {}


@functools.lru_cache(maxsize=None)
def transfer_grid(folder: str, dtype: str, hidden: int, inter: int, topk: int, n_experts: int, gated: bool,
                  peak: float, bw: float, framework: str = DEFAULT_FRAMEWORK,
                  sigma: float = TRANSFER_SIGMA) -> Grid | None:
    """Log seconds of the routed experts of MoE shape ``(hidden, inter, topk, n_experts)`` on the grid
    of the MoE table's token counts and EP sizes, by efficiency transfer from the OTHER measured
    shapes of the same dtype on the same GPU folder (:func:`moe_sources`; the shape itself is left
    out, so pricing a measured shape this way is its leave-one-out prediction): at each grid point
    (``T`` tokens, EP ``p``), each measured shape ``s`` is read at the same tokens per routed expert
    (``T_s = T (k / E) / (k_s / E_s)``) and the same EP size, where its table measured that point; its
    efficiency is its roofline (:func:`moe_roofline_seconds` at ``peak``, ``bw``) over its measured
    seconds; the transferred efficiency is the geometric mean of those efficiencies, each weighted by
    ``exp(-d^2 / 2 sigma^2)`` with ``d^2`` the summed squared log ratios of hidden, intermediate, top-k
    and expert count (``sigma`` infinite: equal weights); the price is the shape's roofline over that
    efficiency. A point no measured shape covers is NaN (no transfer). Cached per (folder, dtype,
    shape, device peak and bandwidth)."""
    dt, src = moe_sources(folder, dtype, framework)
    src = {k: g for k, g in src.items() if k != (hidden, inter, topk, n_experts)}
    if not src:
        return None
    tok_ax = np.unique(np.concatenate([g.axes[0] for g in src.values()]))
    ep_ax = np.unique(np.concatenate([g.axes[1] for g in src.values()]))
    T, P = np.meshgrid(np.exp(tok_ax), np.exp(ep_ax), indexing="ij")
    wb = MOE_WEIGHT_BYTES.get(dt, 2.0)
    les, logw = [], []  # per measured shape: log efficiency at each grid point (NaN: not measured)
    for (h, i, k, E), g in src.items():
        Ts = T * (topk / n_experts) / (k / E)
        sec, code = interpolate(g, (Ts, P))
        with np.errstate(divide="ignore", invalid="ignore"):
            le = np.log(moe_roofline_seconds(Ts, P, h, i, k, E, peak, bw, wb, True)) - np.log(sec)
        les.append(np.where(code == MEASURED, le, np.nan))
        d2 = sum(np.log(a / b) ** 2 for a, b in ((h, hidden), (i, inter), (k, topk), (E, n_experts)))
        logw.append(0.0 if not np.isfinite(sigma) else -0.5 * d2 / sigma ** 2)
    les = np.stack(les)
    lw = np.where(np.isnan(les), -np.inf, np.asarray(logw)[:, None, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.exp(lw - lw.max(axis=0))  # relative to the nearest shape measured at each point
        log_eff = np.nansum(w * np.nan_to_num(les), axis=0) / w.sum(axis=0)
        roof = moe_roofline_seconds(T, P, hidden, inter, topk, n_experts, peak, bw, wb, gated)
        vals = np.log(roof) - log_eff
    return Grid((tok_ax, ep_ax), vals)


def moe_transfer_seconds(folder: str, tokens, ep, hidden, inter, topk, n_experts, peak, bw,
                         dtype: str = "bf16", imbalance=1.0, gated=True, framework: str = DEFAULT_FRAMEWORK,
                         sigma: float = TRANSFER_SIGMA):
    """Seconds of the routed experts of a MoE shape the MoE table did not measure (the operator of
    :func:`moe_seconds`, read at ``tokens * imbalance``), priced on :func:`transfer_grid` (log-log
    in tokens and EP size like a table), and the reason code of each plan: :data:`TRANSFERRED` where
    priced, 5/6 outside the grid or where no measured shape covers the point, 9 where the folder has
    fewer than two measured shapes of the dtype. ``peak`` and ``bw``: the device's FLOP/s at the
    compute dtype and HBM bandwidth (only their ratio moves the price: it sets the ridge point)."""
    tok = np.asarray(tokens, dtype=float) * np.asarray(imbalance, dtype=float)
    ep = np.asarray(ep, dtype=float)
    shape = np.broadcast_shapes(tok.shape, ep.shape)
    g = transfer_grid(folder, dtype, int(hidden), int(inter), int(topk), int(n_experts), bool(gated),
                      float(peak), float(bw), framework, float(sigma))
    if g is None:
        return np.full(shape, np.nan), np.full(shape, 9, dtype=np.int8)
    sec, code = interpolate(g, (tok, ep))
    return sec, np.where(code == MEASURED, TRANSFERRED, code).astype(np.int8)


# the GPU folders, dtypes and token counts of the leave-one-shape-out check (decode: a step's tokens
# across the EP group; prefill: a chunk's)
VALIDATION_FOLDERS = ("b200_sxm", "h200_sxm", "h100_sxm")
VALIDATION_DTYPES = ("bf16", "fp8")
VALIDATION_TOKENS = {"decode": (16, 64, 256), "prefill": (2048, 8192)}


def _folder_device(folder: str) -> str:
    for name, (f, comm, _) in DEVICE_TABLES.items():
        if f == folder and comm:
            return name
    raise TableError(f"no device of data/hardware.csv maps to the GPU folder {folder!r} (DEVICE_TABLES)")


def moe_transfer_validation(folders=VALIDATION_FOLDERS, dtypes=VALIDATION_DTYPES, tokens=None,
                            sigma: float = TRANSFER_SIGMA,
                            framework: str = DEFAULT_FRAMEWORK) -> pd.DataFrame:
    """Leave-one-shape-out check of the two prices of an unmeasured MoE shape: every measured shape
    (balanced routing, expert TP 1) of each folder and dtype is priced as if the table lacked it, (a)
    as per-expert GEMMs (:func:`expert_gemm_seconds`, the fallback before 2026-12-03) and (b) by
    efficiency transfer from the other shapes (:func:`moe_transfer_seconds`), at each of its measured
    EP sizes and the token counts of ``tokens`` (default :data:`VALIDATION_TOKENS`), against its
    measured seconds. One row per point: ``folder, dtype`` (the table's), ``hidden, inter, topk,
    experts, ep, tokens, regime, measured_s, gemm_s, transfer_s, err_gemm, err_transfer`` (relative
    error ``|predicted / measured - 1|``; NaN where a method cannot price the point)."""
    tokens = VALIDATION_TOKENS if tokens is None else tokens
    rows = []
    for folder in folders:
        gpu = forward._gpu(_folder_device(folder))
        for dtype in dtypes:
            dt, src = moe_sources(folder, dtype, framework)
            peak, bw = gpu.flops(dtype), gpu["hbm_bandwidth"]
            for (h, i, k, E), g in sorted(src.items()):
                for ep in np.round(np.exp(g.axes[1])):
                    for regime, toks in tokens.items():
                        T = np.asarray(toks, dtype=float)
                        meas, c0 = interpolate(g, (T, np.full(T.shape, ep)))
                        old, c1 = expert_gemm_seconds(folder, T, np.ceil(E / ep), E, k, h, i, True, dtype,
                                                      1.0, framework)
                        new, c2 = moe_transfer_seconds(folder, T, ep, h, i, k, E, peak, bw, dtype, 1.0, True,
                                                       framework, sigma)
                        for j in range(T.size):
                            if c0[j] != MEASURED:
                                continue
                            o = old[j] if c1[j] == MEASURED else np.nan
                            n = new[j] if c2[j] == TRANSFERRED else np.nan
                            rows.append({"folder": folder, "dtype": dt, "hidden": h, "inter": i, "topk": k,
                                         "experts": E, "ep": int(ep), "tokens": int(T[j]), "regime": regime,
                                         "measured_s": meas[j], "gemm_s": o, "transfer_s": n,
                                         "err_gemm": abs(o / meas[j] - 1.0),
                                         "err_transfer": abs(n / meas[j] - 1.0)})
    return pd.DataFrame(rows)


def moe_transfer_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th percentile of each method's relative error in :func:`moe_transfer_validation`'s
    rows, per GPU folder, dtype and regime (``points``: rows; ``shapes``: measured shapes left out;
    ``priced_*``: the share of the rows each method could price)."""
    out = []
    for (f, d, r), g in df.groupby(["folder", "dtype", "regime"], sort=False):
        row = {"folder": f, "dtype": d, "regime": r, "points": len(g),
               "shapes": g.groupby(["hidden", "inter", "topk", "experts"]).ngroups}
        for m in ("gemm", "transfer"):
            e = g[f"err_{m}"].dropna()
            row.update({f"median_{m}": e.median(), f"p90_{m}": e.quantile(0.9),
                        f"priced_{m}": len(e) / len(g)})
        out.append(row)
    return pd.DataFrame(out)


def deepep_seconds(folder: str, tokens, n, hidden, topk, n_experts, imbalance=1.0):
    """Measured seconds of one DeepEP low-latency dispatch plus combine (SGLang's tables) for
    ``tokens`` tokens per rank over ``n`` GPUs (``ceil(n / 8)`` nodes of 8 GPUs), read at ``tokens *
    imbalance`` (the busiest rank receives and returns ``imbalance`` times the mean), log-log in tokens
    at exactly the measured node count, hidden size, top-k and expert count (code 13 otherwise, 5
    outside the measured tokens); ``n <= 1`` is no operator."""
    tok, n = np.broadcast_arrays(np.asarray(tokens, dtype=float) * np.asarray(imbalance, dtype=float),
                                 np.asarray(n, dtype=float))
    sec, code = np.full(tok.shape, np.nan), np.full(tok.shape, 13, dtype=np.int8)
    if folder not in DEEPEP_FOLDERS:
        code[...] = 14
    else:
        t = merged_table(folder, "deepep_ll", DEEPEP_FRAMEWORK)
        nodes = np.ceil(n / GPUS_PER_NODE)
        for nn in np.unique(nodes[n > 1]):
            g = t.grid((int(nn), int(hidden), int(topk), int(n_experts)))
            sel = nodes == nn
            if g is not None:
                sec[sel], code[sel] = interpolate(g, (tok[sel],))
    return np.where(n <= 1, 0.0, sec), np.where(n <= 1, NO_OP, code).astype(np.int8)


# ----------------------------------------------------------------------------------------- backend


class Fallbacks:
    """Seconds and operator evaluations priced by the roofline instead of a table, per
    ``(device, kind, reason)``; ``measured`` the same for the operators read from tables. Seconds are
    those of one instance of each operator, summed over the plans (:func:`analysis.forward.price`
    multiplies by the operator's count per pass after the backend; its :func:`analysis.forward.ledger`
    holds the counted seconds and the measured share)."""

    def __init__(self):
        self.by_reason: dict[tuple[str, str, str], list] = {}
        self.measured: dict[tuple[str, str], list] = {}

    def add(self, device, kind, reason, seconds, count):
        e = self.by_reason.setdefault((device, kind, reason), [0.0, 0])
        e[0] += float(seconds)
        e[1] += int(count)

    def add_measured(self, device, kind, seconds, count):
        e = self.measured.setdefault((device, kind), [0.0, 0])
        e[0] += float(seconds)
        e[1] += int(count)

    def table(self) -> pd.DataFrame:
        rows = [{"device": d, "kind": k, "reason": r, "seconds": s, "evaluations": c}
                for (d, k, r), (s, c) in sorted(self.by_reason.items())]
        return pd.DataFrame(rows, columns=["device", "kind", "reason", "seconds", "evaluations"])


_FALLBACKS: contextvars.ContextVar = contextvars.ContextVar("measured_fallbacks", default=None)
TOTALS = Fallbacks()  # the whole process's record: no fallback goes unrecorded


@contextlib.contextmanager
def fallbacks():
    """Record the fallbacks (and measured operators) priced inside the ``with`` block."""
    rec = Fallbacks()
    tok = _FALLBACKS.set(rec)
    try:
        yield rec
    finally:
        _FALLBACKS.reset(tok)


def _record(device, kind, code, seconds, detail: dict):
    recs = [TOTALS] + ([_FALLBACKS.get()] if _FALLBACKS.get() is not None else [])
    c = code.ravel().astype(np.intp)
    n = np.bincount(c, minlength=len(REASONS) + 2)
    sec = np.bincount(c, weights=np.ravel(seconds), minlength=len(n))
    for i in np.flatnonzero(n):
        for r in recs:
            if i == MEASURED:
                r.add_measured(device, kind, sec[i], n[i])
            elif i != NO_OP:
                r.add(device, kind, detail.get(int(i), REASONS.get(int(i), str(i))), sec[i], n[i])


def _price(device: str, folder: str | None, comm_tables: bool, framework: str, note: str,
           weight_only: bool, op, eff):
    roof, _ = forward.roofline_backend(op, eff)
    roof = np.asarray(roof, dtype=float)
    detail = {8: f"{REASONS[8]}: {note}"} if note else {}
    if folder is None:
        code = np.full(roof.shape, 2, dtype=np.int8)
        detail[2] = f"{REASONS[2]} ({device})"
        sec = roof
    elif op.kind in ("gemm", "moe") and weight_only:
        code, sec = np.full(roof.shape, 12, dtype=np.int8), roof
    elif op.kind == "gemm":
        sec, code = gemm_seconds(folder, op.shape["m"], op.shape["n"], op.shape["k"], op.dtype, framework)
    elif op.kind == "allreduce":
        if comm_tables:
            sec, code = allreduce_seconds(folder, op.shape["bytes"], op.shape["n"], framework)
        else:
            n = np.asarray(op.shape["n"], dtype=float)
            sec, code = np.zeros(n.shape), np.where(n > 1, 8, NO_OP).astype(np.int8)
    elif op.kind == "moe" and "hidden" in op.shape and "inter" in op.shape:
        return _price_moe(device, folder, framework, op, eff, roof, detail)
    elif op.kind == "alltoall" and "hidden" in op.shape and "tokens" in op.shape:
        sh = op.shape
        if not comm_tables:
            n = np.asarray(sh["n"], dtype=float)
            sec, code = np.zeros(n.shape), np.where(n > 1, 8, NO_OP).astype(np.int8)
        else:
            sec, code = deepep_seconds(folder, sh["tokens"], sh["n"], sh["hidden"], sh["k"], sh["n_experts"],
                                       sh.get("imbalance", 1.0))
    elif op.kind == "attention" and op.shape.get("family") == "mla":
        code, sec = np.full(roof.shape, 11, dtype=np.int8), roof
    elif op.kind == "attention" and "heads" in op.shape and "head_dim" in op.shape:
        sh = op.shape
        sec, code = attention_seconds(folder, sh["batch"], sh["tokens"], sh["kv_tokens"], sh["heads"],
                                      sh["kv_heads"], sh["head_dim"], sh.get("window", 0.0),
                                      sh.get("kv_dtype", "bf16"), framework)
    else:
        code = np.full(roof.shape, 3, dtype=np.int8)
        detail[3] = KIND_REASONS.get(op.kind, f"{op.kind}: no table")
        sec = roof
    sec, code, roof = np.broadcast_arrays(sec, code, roof)
    ok = code == MEASURED
    out = np.where(ok, sec, np.where(code == NO_OP, 0.0, roof))
    _record(device, op.kind, code, out, detail)
    return out, ok.astype(float)


def _price_moe(device, folder, framework, op, eff, roof, detail):
    """The MoE operator: routed experts from the MoE table, else by efficiency transfer from the
    measured shapes (:func:`moe_transfer_seconds`, code :data:`TRANSFERRED`), else as per-expert GEMMs
    from the GEMM table, else the roofline; the shared experts and router (``rest_flops``/
    ``rest_bytes``) by the roofline at the stated efficiencies. Measured share: the routed experts'
    part of the seconds where the MoE or GEMM table priced them (0 for a transferred price)."""
    sh = op.shape
    args = (sh["hidden"], sh["inter"], sh["k"], sh["n_experts"])
    imb = sh.get("imbalance", 1.0)
    etp = sh.get("moe_tp", 1.0)
    sec, code = moe_seconds(folder, sh["tokens"], sh["n"], *args, op.dtype, imb, framework, moe_tp=etp)
    shp = np.broadcast_shapes(np.shape(sec), np.shape(sh["tokens"]), np.shape(sh["experts"]), np.shape(imb),
                              np.shape(etp))
    sec, code = (np.array(np.broadcast_to(x, shp)) for x in (sec, code))
    miss = code != MEASURED
    if miss.any() and np.size(op.peak) == 1 and np.size(op.bw) == 1:
        # shapes or points the MoE table lacks: the efficiency of the measured shapes transferred
        sub = [np.broadcast_to(np.asarray(x, dtype=float), shp)[miss] for x in (sh["tokens"], sh["n"], imb)]
        peak, bw = float(np.ravel(op.peak)[0]), float(np.ravel(op.bw)[0])
        sec[miss], code[miss] = moe_transfer_seconds(folder, sub[0], sub[1], *args, peak, bw, op.dtype,
                                                     sub[2], sh.get("gated", True), framework)
        miss = (code != MEASURED) & (code != TRANSFERRED)
    if miss.any():  # beyond every measured shape's tokens or EP sizes: per-expert GEMMs, those plans only
        sub = [np.broadcast_to(np.asarray(x, dtype=float), shp)[miss]
               for x in (sh["tokens"], sh["experts"], imb, etp)]
        # tensor-split experts: each slice's GEMMs are 1 / moe_tp as wide (the intermediate dimension)
        sec[miss], code[miss] = expert_gemm_seconds(folder, sub[0], sub[1], sh["n_experts"], sh["k"],
                                                    args[0], args[1] / sub[3], sh.get("gated", True),
                                                    op.dtype, sub[2], framework)
    rest = np.maximum(sh["rest_flops"] / (op.peak * eff.compute), sh["rest_bytes"] / (op.bw * eff.bandwidth))
    sec, code, roof, rest = np.broadcast_arrays(sec, code, roof, rest)
    ok = code == MEASURED
    out = np.where(ok | (code == TRANSFERRED), sec + rest, roof)
    _record(device, "moe", code, out, detail)
    # a transferred price is derived from the tables, not a measured point: not in the measured share
    return out, np.where(ok, sec / np.where(ok, out, 1.0), 0.0)


def backend_name(device: str, framework: str = DEFAULT_FRAMEWORK, weight_only: bool = False) -> str:
    """The registered backend name of ``device`` (``"measured:<device>"``, ``@<framework>`` appended
    for a framework other than the default, ``+weight-only`` for weights stored in fewer bytes than
    the compute dtype, whose GEMMs fall back: an :class:`analysis.forward.Op` carries only the compute
    dtype), registering it on first use."""
    name = (f"measured:{device}" + ("" if framework == DEFAULT_FRAMEWORK else f"@{framework}")
            + ("+weight-only" if weight_only else ""))
    if name not in forward.backends():
        folder, comm, note = DEVICE_TABLES.get(device, (None, False, ""))
        forward.register_backend(name, functools.partial(_price, device, folder, comm, framework, note,
                                                         weight_only))
    return name


# bytes per element of each compute dtype's GEMM operands (forward.WEIGHT_FORMATS's compute names)
COMPUTE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5625}


def device(name: str, prec: forward.Precision = forward.Precision(),
           framework: str = DEFAULT_FRAMEWORK) -> dict:
    """:func:`analysis.forward.instance_device` of a GPU priced by its measured tables (weight-only
    quantised precisions, such as ``int4`` with bf16 math, get the backend whose GEMMs fall back)."""
    weight_only = prec.weight_bytes < COMPUTE_BYTES.get(prec.compute, 2.0) - 1e-9
    return {**forward.instance_device(name, prec), "backend": backend_name(name, framework, weight_only)}


for _d in DEVICE_TABLES:
    backend_name(_d)


# ------------------------------------------------------------------- tensor-split experts (issue 27 item 4)

# where the MoE table lacks a model's expert shape, the tensor-split ratio of the nearest measured shape
# (same dtype, the split and the spread layout both measured) at the same routed tokens per expert is used:
# every read is recorded here, (folder, dtype, shape, moe_tp, n) -> the (table dtype, shape) used or None
SPLIT_SUBSTITUTES: dict = {}


def _split_grids(t: Table, dt: str, key: tuple, mt: int, n: float):
    """The (tensor-split, spread) grids of ``key`` = (hidden, inter, topk, n_experts) when the table
    holds ``moe_tp = mt`` at ``ep = n / mt`` and ``moe_tp = 1`` at ``ep = n``, else None."""
    a = t.grid((dt, *key, MOE_DISTRIBUTION, int(mt)))
    b = t.grid((dt, *key, MOE_DISTRIBUTION, 1))
    if a is None or b is None:
        return None
    ok = lambda g, ep: g.axes[1][0] - 1e-9 <= np.log(ep) <= g.axes[1][-1] + 1e-9  # noqa: E731
    return (a, b) if ok(a, n / mt) and ok(b, n) else None


@functools.lru_cache(maxsize=None)
def _split_source(folder: str, dtype: str, key: tuple, mt: int, n: float, framework: str):
    """(moe dtype, shape key, the tensor-split and spread grids) of ``key`` or, where the table lacks
    it, of the nearest measured shape (smallest sum of |log| ratios of hidden, inter and experts per
    routed slot ``n_experts / topk``), of the dtype, else of the other dtypes in :data:`SPLIT_DTYPE_ORDER`
    (FP4 on Hopper, which has no FP4 table); None where no shape holds both layouts at ``n`` GPUs."""
    t = merged_table(folder, "moe", framework)
    for dt in MOE_DTYPES.get(dtype, (dtype,)):
        g = _split_grids(t, dt, key, mt, n)
        if g is not None:
            return dt, key, g
    for fam in (dtype, *(d for d in SPLIT_DTYPE_ORDER if d != dtype)):
        best = _nearest_split(t, MOE_DTYPES.get(fam, (fam,)), key, mt, n)
        if best is not None:
            return best
    return None


# the dtype families tried, in order, where a run's own has no shape measured in both layouts
SPLIT_DTYPE_ORDER = ("fp8", "bf16", "fp4")


def _nearest_split(t: Table, dtypes, key: tuple, mt: int, n: float):
    """The (dtype, shape, grids) of the shape of ``dtypes`` nearest to ``key`` holding both layouts."""
    h, inter, k, E = key
    best, dist = None, np.inf
    for dt in dtypes:
        for kk in t.grids:
            if kk[0] != dt or kk[5] != MOE_DISTRIBUTION or kk[6] != 1:
                continue
            g = _split_grids(t, dt, kk[1:5], mt, n)
            if g is None:
                continue
            d = (abs(np.log(kk[1] / h)) + abs(np.log(kk[2] / inter))
                 + abs(np.log((kk[4] / kk[3]) / (E / k))))
            if d < dist:
                best, dist = (dt, kk[1:5], g), d
    return best


def moe_split_ratio(folder: str, tokens, n, moe_tp, hidden, inter, topk, n_experts, dtype: str = "bf16",
                    framework: str = DEFAULT_FRAMEWORK):
    """How much slower AIConfigurator's measured MoE kernel runs the routed experts of ``tokens``
    tokens on ``n`` GPUs with the experts tensor-split ``moe_tp`` ways (``moe_ep = n / moe_tp``
    expert-parallel groups) than spread over the ``n`` GPUs (``moe_tp = 1``, ``moe_ep = n``), both
    with balanced routing: ``moe_seconds(moe_tp, ep) / moe_seconds(1, n)`` of the table of ``folder``
    (``framework``'s, merged over versions). The roofline prices the two layouts alike (the same FLOPs
    and expert bytes per GPU); this ratio is the tensor-split GEMMs' lower efficiency the measured
    kernels show (DeepSeek-V3 FP8 on 8 GPUs: 1.4x-3.9x,
    :func:`analysis.disagg.revalidate.moe_split_kernel_values`).

    Where the table lacks the shape (or either layout at these GPU counts) the nearest measured shape's
    ratio (:func:`_split_source`) is read at the same routed tokens per expert (``tokens * topk /
    n_experts``), recorded in :data:`SPLIT_SUBSTITUTES`; token counts outside a grid's range are read at
    its nearest end. 1 where ``moe_tp <= 1``, and where no shape of the dtype holds both layouts (also
    recorded, as None). Vectorised over ``tokens``, ``n`` and ``moe_tp``."""
    tok, n_, mt_ = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (tokens, n, moe_tp)))
    key = (int(hidden), int(inter), int(topk), int(n_experts))
    # the same call again (a calibration fit re-prices the same runs at many parameter vectors): the
    # stored ratios, with the same substitutes recorded; the tables are read once per process
    memo_key = (folder, dtype, key, framework, tok.shape, tok.tobytes(), n_.tobytes(), mt_.tobytes(),
                float(topk), float(n_experts))
    hit = _SPLIT_RATIO_MEMO.get(memo_key)
    if hit is not None:
        SPLIT_SUBSTITUTES.update(hit[1])
        return hit[0].copy()
    out = np.ones(tok.shape)
    recorded = {}
    split = mt_ > 1
    for nn, mt in {(float(a), float(b)) for a, b in zip(n_[split], mt_[split])}:
        sel = split & (n_ == nn) & (mt_ == mt)
        src = _split_source(folder, dtype, key, int(round(mt)), nn, framework)
        # recorded: the (moe dtype, shape) whose ratio is used, None where none holds both layouts
        SPLIT_SUBSTITUTES[(folder, dtype, key, mt, nn)] = recorded[(folder, dtype, key, mt, nn)] = (
            None if src is None else (src[0], src[1]))
        if src is None:
            continue
        _, kk, (ga, gb) = src
        t = tok[sel] * (topk / n_experts) / (kk[2] / kk[3])  # the same routed tokens per expert
        lo, hi = np.exp(ga.axes[0][0]), np.exp(ga.axes[0][-1])
        lo, hi = max(lo, np.exp(gb.axes[0][0])), min(hi, np.exp(gb.axes[0][-1]))
        t = np.clip(t, lo, hi)
        a, ca = interpolate(ga, (t, np.full_like(t, nn / mt)))
        b, cb = interpolate(gb, (t, np.full_like(t, nn)))
        good = (ca == MEASURED) & (cb == MEASURED)
        out[sel] = np.where(good, a / np.where(good, b, 1.0), 1.0)
    if len(_SPLIT_RATIO_MEMO) >= _SPLIT_RATIO_MEMO_MAX:
        _SPLIT_RATIO_MEMO.clear()
    _SPLIT_RATIO_MEMO[memo_key] = (out.copy(), recorded)
    return out


# moe_split_ratio's results by their full input (bounded; cleared when full)
_SPLIT_RATIO_MEMO: dict = {}
_SPLIT_RATIO_MEMO_MAX = 50_000


def moe_split_dtype(weight_bytes):
    """The MoE table's dtype family of expert weights of ``weight_bytes`` per element (vectorised):
    'bf16' (2 bytes), 'fp8' (1), 'fp4' (below 1: NVFP4 and weight-only int4 read as FP4)."""
    wb = np.asarray(weight_bytes, dtype=float)
    return np.where(wb >= 2.0, "bf16", np.where(wb >= 1.0, "fp8", "fp4"))


def moe_split_slowdown(s: forward.Shape, *, tokens, n, moe_tp, silicon, weight_bytes):
    """Per plan: how much slower tensor-split experts (``moe_tp`` ways on ``n`` devices) run than the
    same experts spread over the ``n`` devices, from AIConfigurator's measured MoE table of the plan's
    GPU (``silicon``: table folder per plan; :func:`moe_split_ratio` at the plan's tokens, the model's
    expert shape and its weights' dtype, :func:`moe_split_dtype` of ``weight_bytes``; a shape the table
    lacks reads the nearest measured shape's ratio at the same tokens per expert, recorded in
    :data:`SPLIT_SUBSTITUTES`). 1 where ``moe_tp`` is 1. Bound to the plans' GPUs
    (``functools.partial``), it is :func:`analysis.forward.ffn_block`'s ``split_slowdown``."""
    shp = np.broadcast_shapes(np.shape(silicon), np.shape(tokens), np.shape(n), np.shape(moe_tp),
                              np.shape(weight_bytes))
    sil = np.broadcast_to(np.asarray(silicon, dtype=object), shp)
    dt = np.broadcast_to(moe_split_dtype(weight_bytes), shp)
    tok, nn, mt = (np.broadcast_to(np.asarray(x, dtype=float), shp) for x in (tokens, n, moe_tp))
    out = np.ones(shp)
    for f, d in {(a, b) for a, b in zip(sil.ravel(), dt.ravel())}:
        sel = (sil == f) & (dt == d) & (mt > 1)
        if sel.any():
            out[sel] = moe_split_ratio(f, tok[sel], nn[sel], mt[sel], s.h, s.moe_inter, s.k_active,
                                       s.n_experts, str(d))
    return out
