"""LMCache's agent traces in Mooncake's format (analysis.tiering.agent_traces, analysis.derive_traces):
chained block ids mean "same prefix up to here", conversion order and validation, the committed
artifact matches its registered raw files."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import artifacts, data, traces
from analysis.tiering import agent_traces as at

BS = 4  # small blocks for hand-made token sequences


def _ids(*seqs, block_size=BS):
    ids = at.BlockIds()
    return [ids(at.block_digests(s, block_size)) for s in seqs]


@pytest.mark.parametrize("k", [0, 1, 3])
def test_shared_full_blocks_share_exactly_the_first_k_ids(k):
    rng = np.random.default_rng(k)
    prefix = rng.integers(0, 1000, k * BS)
    a = np.concatenate([prefix, [1001, 5, 6, 7, 8, 9, 10]])
    b = np.concatenate([prefix, [1002, 5, 6, 7, 8, 9, 10]])  # differs at the first token after the prefix
    ia, ib = _ids(a, b)
    assert ia[:k] == ib[:k]
    assert not set(ia[k:]) & set(ib)
    assert not set(ib[k:]) & set(ia)


@pytest.mark.parametrize("j", [0, 1, 2])
def test_one_token_difference_changes_ids_from_its_block_on(j):
    a = np.arange(4 * BS)
    b = a.copy()
    b[j * BS + 2] = 999
    ia, ib = _ids(a, b)
    assert ia[:j] == ib[:j]
    assert all(x != y for x, y in zip(ia[j:], ib[j:]))


def test_equal_block_after_different_prefix_gets_a_different_id():
    """The chain: block 1 holds the same tokens in both, but their block 0 differ."""
    a = [1, 2, 3, 4, 9, 9, 9, 9]
    b = [5, 6, 7, 8, 9, 9, 9, 9]
    ia, ib = _ids(a, b)
    assert ia[1] != ib[1]


def test_partial_last_block_and_numbering():
    ia, ib = _ids([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7])
    assert ia == [0, 1] and ib == [0, 2]  # the partial block is hashed with its length
    assert _ids([])[0] == []


def _raw(ts, text, out="", session="s"):
    return at.RawRequest(ts, text, out, session, "f:1")


def encode(s):
    return np.array([ord(c) for c in s], dtype=np.int64)


def test_convert_orders_by_time_drops_empty_prompts_and_is_a_valid_mooncake_trace():
    reqs = [_raw(3_000_000, "abcdefgh-second", "xy"), _raw(1_000_000, "abcdefgh-first", "xyz"),
            _raw(2_000_000, "", "zz"), _raw(5_500_000, "qrst")]
    rows, c = at.convert(reqs, encode, block_size=BS)
    assert [r["timestamp"] for r in rows] == [0.0, 2000.0, 4500.0]  # ms since the first kept request
    assert c == {"requests": 3, "dropped_empty_prompt": 1, "distinct_blocks": 7}  # 4 + 2 + 1
    assert rows[0]["input_length"] == len("abcdefgh-first") and rows[0]["output_length"] == 3
    h0, h1 = rows[0]["hash_ids"], rows[1]["hash_ids"]
    assert h0[:2] == h1[:2] and h0[2] != h1[2]
    tr = traces.from_requests(at.from_table(at.to_table(rows)), block_size=BS)  # validates ceil(L/bs) ids
    assert tr.n_requests == 3 and tr.input_tokens.tolist() == [14, 15, 4]
    with pytest.raises(traces.TraceError, match="no request with a non-empty prompt"):
        at.convert([_raw(1, "")], encode, block_size=BS)


def test_parse_session_names_the_bad_line():
    good = '{"timestamp": 5, "input": "a", "output": "b", "session_id": "x"}'
    assert at.parse_session(good + "\n\n" + good, "f.jsonl")[1].where == "f.jsonl:3"
    with pytest.raises(traces.TraceError, match=r"f.jsonl:2: missing field"):
        at.parse_session(good + '\n{"timestamp": 5, "input": "a"}', "f.jsonl")
    with pytest.raises(traces.TraceError, match=r"f.jsonl:1: timestamp must be an integer"):
        at.parse_session('{"timestamp": -1, "input": "a", "output": ""}', "f.jsonl")
    with pytest.raises(traces.TraceError, match=r"f.jsonl:1: not valid JSON"):
        at.parse_session("{", "f.jsonl")


def test_family_names():
    assert at.family_of(at.trace_name("miniswe")) == "miniswe"
    assert at.family_of("mooncake_conversation") is None and at.family_of("lmcache_nope") is None


def test_committed_artifact_matches_its_registered_raw_files():
    art = artifacts.read_artifact(at.ARTIFACT)
    manifest = data.table("lmcache_agent_traces.csv")
    assert set(manifest["family"]) == set(at.FAMILIES)
    assert (manifest["commit"] == at.SOURCE_COMMIT).all() and (manifest["licence"] == at.LICENCE).all()
    raw = art.tables["raw_files"]
    assert raw["sha256"].tolist() == manifest["sha256"].tolist()
    manifest_sha = data.sha256(data.DATA_DIR / "lmcache_agent_traces.csv")
    assert art.provenance["source"]["manifest_sha256"] == manifest_sha
    assert art.provenance["block_size"] == traces.BLOCK_TOKENS
    summ = art.tables["summary"].set_index("family")
    for fam in at.FAMILIES:
        df = art.tables[f"trace_{fam}"]
        tr = traces.from_requests(at.from_table(df), block_size=art.provenance["block_size"])
        assert tr.n_requests == summ.loc[fam, "requests"]
        assert tr.n_unique_blocks == summ.loc[fam, "distinct_blocks"]
        assert np.all(np.diff(df["timestamp_ms"]) >= 0)


def test_derive_refuses_a_raw_file_that_differs_from_its_registration(tmp_path, monkeypatch):
    from analysis import derive_traces as dt

    m = data.table("lmcache_agent_traces.csv").head(1)
    p = tmp_path / m["path"].iloc[0]
    p.parent.mkdir(parents=True)
    p.write_text('{"timestamp": 1, "input": "x", "output": ""}\n')
    with pytest.raises(data.DataError, match="sha256 .* but data/lmcache_agent_traces.csv registers"):
        dt.verified(dt.Source(tmp_path), m)
    assert isinstance(dt.register(dt.Source(tmp_path)), pd.DataFrame)


def test_chapter_reads_an_agent_family_as_its_trace_and_compares_every_family():
    from analysis.tiering import agents, chapter
    from analysis.tiering.configure import deployment, economics
    from analysis.tiering.hitcurve import lru_hit_curve
    from analysis.tiering.params import SCHEMA

    cfg = SCHEMA.config(SCHEMA.defaults())
    dep = deployment(cfg)
    econ = economics(cfg, dep)
    tr = chapter.load("lmcache_taubench", 100)
    assert tr.n_requests == 100 and tr.name.startswith("lmcache_taubench")
    assert chapter.cache_ratio("lmcache_taubench", tr, lru_hit_curve(tr))["setting_trace"] is None
    own = agents.load("lmcache_miniswe")
    cmp = agents.compare(("lmcache_miniswe", own, lru_hit_curve(own)), dep, econ, ["hbm", "dram", "nvme"])
    t = cmp["table"]
    assert t["trace"].tolist() == ["lmcache_miniswe", "lmcache_taubench", "lmcache_magagent"]  # no duplicate
    assert set(cmp["curves"]) == set(t["trace"])
    assert cmp["curve_seconds"] < 2.0  # issue 32: each curve at most 2 s (these take about 0.03 s)
    assert (t["hit_hbm"] <= t["cache_ratio"] + 1e-12).all() and (t["hit_3m"] >= t["hit_hbm"] - 1e-12).all()
    caps, rate = cmp["curves"]["lmcache_taubench"]
    assert np.all(np.diff(rate) >= -1e-12) and rate[-1] == pytest.approx(t.loc[1, "cache_ratio"])
    keys = {r[0] for r in agents.glue_rows(t)}
    assert {f"ch2_agent_{f}_ratio" for f in at.FAMILIES} <= keys
    with pytest.raises(traces.TraceError, match="not an agent trace"):
        agents.load("lmcache_nope")
