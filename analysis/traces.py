"""Mooncake-format request traces (JSONL): one request per line.

Each line is a JSON object with ``timestamp`` (arrival, milliseconds from the start of the trace),
``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (one integer per KV block of the
prompt, ``block_size`` = 512 tokens in the public Mooncake traces; equal ids at the start of two
prompts mean a reusable prefix). :func:`load_trace` reads a registered trace by name (through
:mod:`analysis.data`, sha256-verified) or any file in the same format by path, validates every line
and returns a :class:`Trace` of flat numpy arrays (SI units: seconds, tokens).

Errors are :class:`TraceError` and name the file and line number of the first bad line; a missing
file says how to obtain it.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import data

BLOCK_TOKENS = 512  # block size of the public Mooncake traces (FAST'25 appendix)


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Trace:
    """A request trace as flat arrays. Request ``i`` owns blocks ``block_ids[offsets[i]:offsets[i+1]]``."""

    name: str
    arrival_s: np.ndarray        # float64, seconds since the first request
    input_tokens: np.ndarray     # int64
    output_tokens: np.ndarray    # int64
    offsets: np.ndarray          # int64, len n_requests + 1
    block_ids: np.ndarray        # int64, the hash_ids of all requests, concatenated
    block_tokens: np.ndarray     # int64, tokens in each block (the last block of a prompt may be partial)
    block_size: int = BLOCK_TOKENS

    @property
    def n_requests(self) -> int:
        return len(self.input_tokens)

    @property
    def n_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def n_unique_blocks(self) -> int:
        s = np.sort(self.block_ids)
        return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))

    def single_use_share(self) -> float:
        """Share of the distinct blocks that are accessed once only (no later request reuses them)."""
        if not self.n_blocks:
            return 0.0
        _, counts = np.unique(self.block_ids, return_counts=True)
        return float(np.mean(counts == 1))

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if self.n_requests else 0.0

    def request_blocks(self, i: int) -> np.ndarray:
        return self.block_ids[self.offsets[i]:self.offsets[i + 1]]

    def head(self, n: int) -> "Trace":
        """The first ``n`` requests (for quick tests)."""
        n = min(int(n), self.n_requests)
        e = int(self.offsets[n])
        return Trace(f"{self.name}[:{n}]", self.arrival_s[:n], self.input_tokens[:n], self.output_tokens[:n],
                     self.offsets[:n + 1].copy(), self.block_ids[:e], self.block_tokens[:e], self.block_size)

    def summary(self) -> dict:
        return {
            "requests": self.n_requests, "blocks": self.n_blocks, "unique_blocks": self.n_unique_blocks,
            "input_tokens": int(self.input_tokens.sum()), "output_tokens": int(self.output_tokens.sum()),
            "mean_input_tokens": float(self.input_tokens.mean()) if self.n_requests else 0.0,
            "mean_output_tokens": float(self.output_tokens.mean()) if self.n_requests else 0.0,
            "duration_s": self.duration_s,
        }


def from_requests(requests, *, name: str = "in-memory", block_size: int = BLOCK_TOKENS) -> Trace:
    """Build a :class:`Trace` from dicts with the four Mooncake fields (validated as lines are)."""
    return _build(list(requests), name, block_size, check_blocks=True)


def _bad(where: str, lineno: int, why: str):
    raise TraceError(f"{where}:{lineno}: {why}")


def _validate(obj, where: str, lineno: int, block_size: int, check_blocks: bool) -> tuple:
    if not isinstance(obj, dict):
        _bad(where, lineno, f"expected a JSON object, got {type(obj).__name__}")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            _bad(where, lineno, f"missing field {key!r} (a Mooncake trace line has timestamp, input_length, "
                                f"output_length and hash_ids)")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        _bad(where, lineno, f"timestamp must be a number >= 0 (milliseconds), got {ts!r}")
    vals = []
    for key in ("input_length", "output_length"):
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            _bad(where, lineno, f"{key} must be an integer >= 0 (tokens), got {v!r}")
        vals.append(v)
    h = obj["hash_ids"]
    if not isinstance(h, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in h):
        _bad(where, lineno, f"hash_ids must be a list of integers >= 0, got {str(h)[:80]}")
    if check_blocks:
        need = -(-vals[0] // block_size)
        if len(h) != need:
            _bad(where, lineno, f"{len(h)} hash_ids for input_length {vals[0]}: expected ceil({vals[0]}/"
                                f"{block_size}) = {need} (block_size {block_size})")
    return float(ts), vals[0], vals[1], h


def _build(objs, where: str, block_size: int, check_blocks: bool, linenos=None) -> Trace:
    if block_size <= 0:
        raise TraceError(f"block_size must be positive, got {block_size}")
    rows = []
    last_ts = -math.inf
    for i, obj in enumerate(objs):
        ln = linenos[i] if linenos is not None else i + 1
        r = _validate(obj, where, ln, block_size, check_blocks)
        if r[0] < last_ts:
            _bad(where, ln, f"timestamp {r[0]:g} ms is earlier than the previous line's {last_ts:g} ms; "
                            f"requests must be in arrival order")
        last_ts = r[0]
        rows.append(r)
    if not rows:
        raise TraceError(f"{where}: the trace holds no requests")
    ts = np.array([r[0] for r in rows], dtype=float)
    inp = np.array([r[1] for r in rows], dtype=np.int64)
    out = np.array([r[2] for r in rows], dtype=np.int64)
    lens = np.array([len(r[3]) for r in rows], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    ids = np.fromiter((x for r in rows for x in r[3]), dtype=np.int64, count=int(offsets[-1]))
    # tokens per block: block k of a prompt of L tokens holds clip(L - k*block_size, 0, block_size)
    k = np.arange(len(ids)) - np.repeat(offsets[:-1], lens)
    tok = np.clip(np.repeat(inp, lens) - k * block_size, 0, block_size).astype(np.int64)
    return Trace(str(where), (ts - ts[0]) / 1e3, inp, out, offsets, ids, tok, block_size)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, size: int, mtime_ns: int, block_size: int, check_blocks: bool,
                 name: str) -> Trace:
    objs, linenos = [], []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}): "
                                 f"{line.strip()[:80]!r}") from None
            linenos.append(lineno)
    tr = _build(objs, path, block_size, check_blocks, linenos)
    return Trace(name, tr.arrival_s, tr.input_tokens, tr.output_tokens, tr.offsets, tr.block_ids,
                 tr.block_tokens, tr.block_size)


def resolve(source: str | os.PathLike) -> Path:
    """Path of a trace given as a registered data name (``mooncake_conversation``) or a file path."""
    s = str(source)
    if s in data.registry():
        return data.path(s)  # raises DataError saying where to obtain it
    p = Path(s).expanduser()
    if not p.is_file() and not p.is_absolute() and (data.REPO_ROOT / p).is_file():
        p = data.REPO_ROOT / p  # a relative path from the repository root (chapters run in book/)
    if not p.is_file():
        entry = data.registry().get("mooncake_conversation", {})
        raise TraceError(
            f"trace file {s!r} not found. Give a registered trace name "
            f"({', '.join(sorted(data.registry()))}) or the path of a Mooncake-format JSONL file. The public "
            f"conversation trace is 'mooncake_conversation' (resolved through data/registry.yaml; download: "
            f"{entry.get('url', '?')}).")
    return p


def recognise(source: str | os.PathLike) -> tuple[str | None, str]:
    """Which registered trace ``source`` is: ``(name, how)``. A registered name is itself; a path is
    recognised by its sha256 (or git blob id) where the registry knows it, else by its file name (the
    registry's mirror file name, e.g. ``toolagent_trace.jsonl``); ``(None, why)`` when neither matches.
    Chapters use it to compare with the published figures of *that* trace."""
    s = str(source)
    reg = data.registry()
    if s in reg:
        return s, "registered name"
    p = resolve(source)
    traces = {n: e for n, e in reg.items() if n.startswith("mooncake_")}
    sha, blob = data.sha256(p), data.git_blob_sha1(p)
    for n, e in traces.items():
        if (e.get("sha256") and e["sha256"] == sha) or \
                (e.get("git_blob_sha1") and e["git_blob_sha1"] == blob):
            return n, "checksum"
    for n, e in traces.items():
        if Path(e["mirror"]).name == p.name:
            return n, f"file name {p.name} (checksum differs from the published file)"
    return None, f"{p.name} is not a registered trace (by checksum or file name)"


def load_trace(source: str | os.PathLike = "mooncake_conversation", *, block_size: int = BLOCK_TOKENS,
               check_blocks: bool = True) -> Trace:
    """Read and validate a Mooncake-format trace (memoised on path, size and mtime).

    ``check_blocks`` requires ``len(hash_ids) == ceil(input_length / block_size)`` on every line."""
    p = resolve(source)
    st = p.stat()
    name = str(source) if str(source) in data.registry() else p.name
    return _load_cached(str(p), st.st_size, st.st_mtime_ns, int(block_size), bool(check_blocks), name)
