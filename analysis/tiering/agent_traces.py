"""Agent sessions as Mooncake-format traces: LMCache's agent traces, tokenized and block-hashed.

The raw files (``LMCache/lmcache-agent-trace``, Apache-2.0; registered with their sha256 in
``data/lmcache_agent_traces.csv``) hold one JSON object per LLM call of an agent session:
``timestamp`` (microseconds since the epoch), ``input`` (the prompt text the agent sent), ``output``
(the response text) and ``session_id``. One folder is one agent family (mini-SWE-agent, tau-bench,
``magagent``), one file one session. This module turns a family into a trace in Mooncake's format
(:mod:`analysis.traces`):

* each request's ``input`` and ``output`` are tokenized with a named tokenizer (a function
  ``encode(text) -> token ids`` the caller supplies, recorded in the provenance);
* the prompt's tokens are cut into blocks of ``block_size`` tokens (512, the block of the public
  Mooncake traces), the last one partial;
* block ``k`` gets the hash of (hash of block ``k-1``, tokens of block ``k``), so equal hashes mean an
  equal prefix up to and including that block, and the hashes are renumbered ``0, 1, 2, ...`` in order
  of first appearance in the family (Mooncake's ``hash_ids`` are small integers too);
* the requests of all sessions of the family are merged in timestamp order (the raw files are not
  sorted: within a session, lines of concurrent calls interleave), timestamps become milliseconds
  since the family's first request; a request whose prompt is empty (nothing to prefill) is dropped
  and counted.

The committed converted traces are written by ``python -m analysis.derive_traces`` (which holds the
tokenizer and the raw-file checks) to ``results/lmcache_agent_traces/``; this module is pure.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces import BLOCK_TOKENS, TraceError

SOURCE_REPO = "LMCache/lmcache-agent-trace"
SOURCE_COMMIT = "16a14adaad43e1a7213f17277726e0abb66ece11"
SOURCE_COMMIT_DATE = "2025-12-25"
LICENCE = "Apache-2.0"
# family (folder of the raw repository) -> what it is (from the repository's README and the prompts)
FAMILIES = {
    "miniswe": "mini-SWE-agent on SWE-bench-style tasks (one bash command per step, whole history resent)",
    "taubench": "tau-bench (a customer-service agent and a simulated user in dialogue)",
    "magagent": "magagent (folder name; its prompts are Magentic-One's orchestrator and agents on "
                "GAIA-style questions; not described in the README)",
}
TRACE_PREFIX = "lmcache_"  # the chapter's trace name of a family: lmcache_<family>
ARTIFACT = "lmcache_agent_traces"
HASH = "blake2b-64 over (previous block's digest, int64 little-endian token ids of the block)"


def trace_name(family: str) -> str:
    return TRACE_PREFIX + family


def family_of(name: str) -> str | None:
    """The family of a chapter trace name ``lmcache_<family>``, or None for any other name."""
    s = str(name)
    if s.startswith(TRACE_PREFIX) and s[len(TRACE_PREFIX):] in FAMILIES:
        return s[len(TRACE_PREFIX):]
    return None


@dataclass(frozen=True)
class RawRequest:
    timestamp_us: int
    input: str
    output: str
    session: str
    where: str  # "file:line"


def parse_session(text: str, where: str) -> list[RawRequest]:
    """The requests of one raw session file (JSONL). A bad line raises :class:`TraceError` naming
    the file and line; blank lines (and an empty file) are allowed."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("timestamp", "input", "output") if k not in obj]
        if missing:
            raise TraceError(f"{where}:{lineno}: missing field(s) {missing} (an agent-trace line has "
                             f"timestamp in microseconds, input and output text, session_id)")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
            raise TraceError(f"{where}:{lineno}: timestamp must be an integer >= 0 (microseconds), "
                             f"got {ts!r}")
        for k in ("input", "output"):
            if not isinstance(obj[k], str):
                raise TraceError(f"{where}:{lineno}: {k} must be text, got {type(obj[k]).__name__}")
        out.append(RawRequest(ts, obj["input"], obj["output"], str(obj.get("session_id", where)),
                              f"{where}:{lineno}"))
    return out


def block_digests(tokens, block_size: int = BLOCK_TOKENS) -> list[bytes]:
    """Chained digests of the blocks of ``tokens``: digest ``k`` covers blocks ``0..k`` (the last block
    may be partial). Two token sequences get equal digests at block ``k`` iff they agree on every token
    of blocks ``0..k`` (up to a 64-bit hash collision)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    t = np.ascontiguousarray(np.asarray(tokens, dtype="<i8"))
    out, prev = [], b""
    for s in range(0, t.size, block_size):
        prev = hashlib.blake2b(prev + t[s:s + block_size].tobytes(), digest_size=8).digest()
        out.append(prev)
    return out


class BlockIds:
    """Digests -> small integers in order of first appearance (one numbering per trace)."""

    def __init__(self):
        self._ids: dict[bytes, int] = {}

    def __call__(self, digests) -> list[int]:
        return [self._ids.setdefault(d, len(self._ids)) for d in digests]

    def __len__(self):
        return len(self._ids)


def convert(requests, encode, *, block_size: int = BLOCK_TOKENS) -> tuple[list[dict], dict]:
    """Mooncake-format request dicts (``timestamp`` ms since the first kept request, ``input_length``,
    ``output_length``, ``hash_ids``; plus ``session``) of the :class:`RawRequest` s ``requests`` (any
    order: merged by timestamp, ties in the order given), and counts of what was kept and dropped."""
    reqs = sorted(requests, key=lambda r: r.timestamp_us)  # stable: ties keep file and line order
    ids = BlockIds()
    rows, dropped = [], 0
    t0 = None
    for r in reqs:
        tok = encode(r.input)
        if len(tok) == 0:
            dropped += 1
            continue
        if t0 is None:
            t0 = r.timestamp_us
        rows.append({"timestamp": (r.timestamp_us - t0) / 1e3, "input_length": int(len(tok)),
                     "output_length": int(len(encode(r.output))),
                     "hash_ids": ids(block_digests(tok, block_size)), "session": r.session})
    if not rows:
        raise TraceError("no request with a non-empty prompt: nothing to convert")
    return rows, {"requests": len(rows), "dropped_empty_prompt": dropped, "distinct_blocks": len(ids)}


def to_table(rows):
    """The converted requests as a table (``hash_ids`` space-separated), the form committed."""
    return pd.DataFrame({"timestamp_ms": [r["timestamp"] for r in rows],
                         "input_length": [r["input_length"] for r in rows],
                         "output_length": [r["output_length"] for r in rows],
                         "session": [r["session"] for r in rows],
                         "hash_ids": [" ".join(map(str, r["hash_ids"])) for r in rows]})


def from_table(df) -> list[dict]:
    """Mooncake request dicts from a committed table (:func:`to_table`'s inverse)."""
    need = {"timestamp_ms", "input_length", "output_length", "hash_ids"}
    if not need <= set(df.columns):
        raise TraceError(f"converted agent trace lacks columns {sorted(need - set(df.columns))}: "
                         f"recompute it with `python -m analysis.derive_traces`")
    h = df["hash_ids"].fillna("").astype(str)
    return [{"timestamp": float(t), "input_length": int(i), "output_length": int(o),
             "hash_ids": [int(x) for x in s.split()]}
            for t, i, o, s in zip(df["timestamp_ms"], df["input_length"], df["output_length"], h)]
