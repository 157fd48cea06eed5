"""Traces are recognised as one of the registered Mooncake traces, and chapter 2's Table 2 verdict
compares with *that* trace's published figure (or says there is none)."""
import json
import shutil

import numpy as np
import pytest

from analysis import claims, data, traces
from analysis.tiering import lru_hit_curve


def _write(path, reqs):
    with open(path, "w") as fh:
        for r in reqs:
            fh.write(json.dumps(r) + "\n")
    return path


def _trace(share_blocks: int, n: int = 40):
    """n requests of 4 blocks; the first ``share_blocks`` blocks are a common prefix."""
    out, nxt = [], 1000
    for i in range(n):
        ids = list(range(share_blocks)) + list(range(nxt, nxt + 4 - share_blocks))
        nxt += 4 - share_blocks
        out.append({"timestamp": i * 100, "input_length": 4 * 512, "output_length": 10, "hash_ids": ids})
    return out


def test_registry_has_all_three_traces_at_one_commit():
    reg = data.registry()
    names = {"mooncake_conversation", "mooncake_toolagent", "mooncake_synthetic"}
    assert names <= set(reg)
    for n in names:
        assert "3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/" in reg[n]["url"]
    assert reg["mooncake_synthetic"]["sha256"] == \
        "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"


def test_git_blob_id_matches_git():
    # git hash-object of "hello\n" is ce013625030ba8dba906f756967f9e9ca394464a
    import tempfile
    with tempfile.NamedTemporaryFile("w", delete=False) as fh:
        fh.write("hello\n")
    assert data.git_blob_sha1(fh.name) == "ce013625030ba8dba906f756967f9e9ca394464a"


@pytest.mark.parametrize("fname,name,ref", [("toolagent_trace.jsonl", "mooncake_toolagent", 0.59),
                                             ("synthetic_trace.jsonl", "mooncake_synthetic", 0.66),
                                             ("conversation_trace.jsonl", "mooncake_conversation", 0.40)])
def test_trace_by_path_is_judged_against_its_own_table2_figure(tmp_path, fname, name, ref):
    # 3 of 4 blocks shared: token-weighted ratio = 3/4 * 39/40 = 0.73 (first request misses)
    p = _write(tmp_path / fname, _trace(3))
    got, how = traces.recognise(p)
    assert got == name and "file name" in how
    tr = traces.load_trace(p)
    ratio = lru_hit_curve(tr).infinite_token_hit_rate
    assert ratio == pytest.approx(0.75 * 39 / 40)
    v = claims.evaluate("ch2_table2_cache_ratio", ratio, setting={"trace": got})
    assert v.reference == pytest.approx(ref)
    want = (claims.REPRODUCED if abs(ratio - ref) <= 0.1 * ref else claims.PARTLY
            if abs(ratio - ref) <= 0.3 * ref else claims.NOT_REPRODUCED)
    assert v.verdict == want
    # the conversation trace's 40% would call this trace "not reproduced"; its own figure may not
    conv = claims.evaluate("ch2_table2_cache_ratio", ratio, setting={"trace": "mooncake_conversation"})
    assert conv.verdict == claims.NOT_REPRODUCED


def test_unknown_trace_has_no_published_figure(tmp_path):
    p = _write(tmp_path / "my_trace.jsonl", _trace(2))
    got, how = traces.recognise(p)
    assert got is None and "not a registered trace" in how
    v = claims.evaluate("ch2_table2_cache_ratio", 0.5, setting={"trace": got})
    assert v.verdict == claims.NOT_TESTABLE and "no published figure" in v.label


def test_trace_is_recognised_by_checksum_whatever_its_name(tmp_path):
    try:
        src = data.path("mooncake_conversation", download=False)
    except data.DataError:
        pytest.skip("conversation trace not available offline")
    dst = tmp_path / "renamed.jsonl"
    shutil.copy(src, dst)
    assert traces.recognise(dst) == ("mooncake_conversation", "checksum")
    assert np.isfinite(traces.load_trace(dst).n_requests)


def test_a_file_known_only_by_its_git_blob_id_is_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_DATA", str(tmp_path))
    (tmp_path / "mooncake").mkdir()
    _write(tmp_path / "mooncake" / "toolagent_trace.jsonl", _trace(1))
    with pytest.raises(data.DataError, match="git blob sha1"):
        data.path("mooncake_toolagent", download=False)


@pytest.mark.notebook
def test_chapter2_rerun_on_another_trace_uses_its_figure(tmp_path):
    """Chapter 2 run through papermill on a small trace named as the tool&agent trace compares its cache
    ratio with the tool&agent figure (59%), not the conversation trace's 40%."""
    from analysis import rerun

    reqs, nxt = [], 10_000
    for i in range(120):  # 3 of 4 blocks shared by every request after the first
        ids = [1, 2, 3, nxt]
        nxt += 1
        reqs.append({"timestamp": i * 500, "input_length": 4 * 512, "output_length": 20, "hash_ids": ids})
    p = _write(tmp_path / "toolagent_trace.jsonl", reqs)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml_dump({
        "chapter": "book/02_ssd_offload.md", "description": "chapter 2 on a small tool&agent-named trace",
        "fixed": {"trace": str(p), "models_grid": ["Llama-3.1-70B"], "gpus_grid": ["H800-SXM5-80GB"],
                  "configs": ["hbm", "dram", "nvme"], "policies": ["lfu"], "policy_capacities_mtok": [0.5],
                  "breakeven_prices_usd_per_tb": [50.0, 600.0], "breakeven_bw_gb_s": [2.0, 14.0],
                  "max_instances": 4}}))
    df = rerun.run_sweep(sweep, jobs=1, out_root=tmp_path / "runs", progress=False)
    assert (df.status == "ok").all(), df[["run_id", "error"]].to_string()
    row = df.iloc[0]
    assert row["glue.ch2_setting_trace"].startswith("mooncake_toolagent")
    assert float(row["glue.ch2_cache_ratio_pub"]) == pytest.approx(0.59)
    assert "of 59.0%" in row["glue.ch2_verdict_cache_ratio_rule"]
    ratio = float(row["glue.ch2_cache_ratio_tok"])
    assert ratio == pytest.approx(0.75 * 119 / 120)
    want = claims.evaluate("ch2_table2_cache_ratio", ratio, setting={"trace": "mooncake_toolagent"}).verdict
    assert row["glue.ch2_verdict_cache_ratio"].startswith(want)


def yaml_dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj)
