"""vLLM's KV offloading connector (blog post of 2026-01-08) against chapter 2's load-versus-recompute
model: analysis.tiering.loadcompute.cpu_hit_ttft and offload_throughput, and the chapter's comparison
(analysis.tiering.chapter.vllm_offload) with the post's rows of data/published.csv."""
from __future__ import annotations

import numpy as np
import pytest

from analysis import claims, data, kv
from analysis import forward as fw
from analysis.tiering import chapter
from analysis.tiering import loadcompute as lc

M, G = "Llama-3.1-8B", "H100-SXM5-80GB"
B = 47.6 * 2**30
KV_TOK = 131072  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes


def _eff(ce):
    return fw.Efficiency().replace(compute=ce)


def test_cpu_hit_ttft_closed_form():
    """Whole 16-token blocks but the last token's are loaded; recompute is the one time model from
    scratch; overlapped = max + min / layers, added = sum."""
    L = np.array([1000.0, 1024.0, 10000.0])
    r = lc.cpu_hit_ttft(M, G, L, B, compute_eff=0.5)
    add = lc.cpu_hit_ttft(M, G, L, B, compute_eff=0.5, overlap=False)
    np.testing.assert_array_equal(r["cached_tokens"], [992.0, 1008.0, 9984.0])
    assert kv.kv_bytes(M, 1.0, 1, "bf16") == KV_TOK
    np.testing.assert_allclose(r["transfer_s"], r["cached_tokens"] * KV_TOK / B)
    prec = fw.Precision.named("bf16", kv_dtype="bf16")
    np.testing.assert_allclose(r["recompute_s"], fw.prefill_time(M, G, L, 0.0, prec=prec, eff=_eff(0.5)))
    tail = fw.prefill_time(M, G, L - r["cached_tokens"], r["cached_tokens"], prec=prec, eff=_eff(0.5))
    c, t = tail, r["transfer_s"]
    np.testing.assert_allclose(r["load_ttft_s"], np.maximum(c, t) + np.minimum(c, t) / 32)
    np.testing.assert_allclose(add["load_ttft_s"], c + t)
    np.testing.assert_allclose(r["speedup"], r["recompute_s"] / r["load_ttft_s"])
    assert np.all(add["load_ttft_s"] >= r["load_ttft_s"])


def test_cpu_hit_ttft_monotone():
    L = np.arange(1, 11) * 10000.0
    r = lc.cpu_hit_ttft(M, G, L, B, compute_eff=0.5)
    assert np.all(np.diff(r["recompute_s"]) > 0) and np.all(np.diff(r["load_ttft_s"]) > 0)
    assert np.all(np.diff(r["speedup"]) > 0)  # recompute grows faster (attention is quadratic)
    slow = lc.cpu_hit_ttft(M, G, L, B / 4, compute_eff=0.5)
    assert np.all(slow["load_ttft_s"] > r["load_ttft_s"])
    fast = lc.cpu_hit_ttft(M, G, L, B, compute_eff=0.7)
    assert np.all(fast["recompute_s"] < r["recompute_s"])


def test_offload_throughput_closed_forms():
    """At 0% hits a step is chunk/L prompts recomputed; with a slow copy engine the throughput is the
    copy bound (prompt tokens per cached byte), overlap hiding the compute to one layer's share."""
    L, C = 512.0, 8192
    r = lc.offload_throughput(M, G, L, [0.0], B, chunk_tokens=C, compute_eff=0.5)
    prec = fw.Precision.named("bf16", kv_dtype="bf16")
    k = C / L
    step = fw.prefill_time(M, G, L, 0.0, seqs=k, prec=prec, eff=_eff(0.5))
    assert r["load_s"][0] == 0.0
    assert r["tokens_per_s"][0] == pytest.approx(k * L / step)
    slow = 1e8
    s = lc.offload_throughput(M, G, L, [1.0], slow, chunk_tokens=C, compute_eff=0.5)
    cached = s["cached_tokens"][0]
    assert cached == 496.0  # whole blocks, never the last token
    bound = slow * L / (cached * KV_TOK)
    assert s["tokens_per_s"][0] == pytest.approx(bound, rel=0.05)
    assert s["tokens_per_s"][0] <= bound
    one = lc.offload_throughput(M, G, L, [0.5], B, chunk_tokens=0, compute_eff=0.5)
    assert one["prompts_per_step"][0] == 1.0


def test_offload_throughput_monotone_and_added_below_overlapped():
    h = np.linspace(0, 1, 11)
    r = lc.offload_throughput(M, G, 512, h, B, compute_eff=0.5)
    a = lc.offload_throughput(M, G, 512, h, B, compute_eff=0.5, overlap=False)
    assert np.all(np.diff(r["tokens_per_s"]) > 0)
    assert np.all(a["tokens_per_s"] <= r["tokens_per_s"] + 1e-9)
    assert a["tokens_per_s"][0] == pytest.approx(r["tokens_per_s"][0])  # nothing to load at 0%
    fast = lc.offload_throughput(M, G, 512, h, 2 * B, compute_eff=0.5)
    assert np.all(fast["tokens_per_s"] >= r["tokens_per_s"] - 1e-9)


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="bandwidth must be"):
        lc.cpu_hit_ttft(M, G, [1000], 0.0)
    with pytest.raises(ValueError, match="block_tokens"):
        lc.cpu_hit_ttft(M, G, [1000], B, block_tokens=0)
    with pytest.raises(ValueError, match=r"hit_rates must lie in \[0, 1\]"):
        lc.offload_throughput(M, G, 512, [1.5], B)
    with pytest.raises(ValueError, match="chunk_tokens >= 512 or 0"):
        lc.offload_throughput(M, G, 512, [0.5], B, chunk_tokens=256)


def test_published_rows_agree_with_themselves():
    """The gains are the ratios of the read points; the text's ranges match the figure's ends; the
    post's 2 MB block is 16 tokens of Llama-3.1-8B's KV in MiB."""
    pub = chapter.vllm_published()
    for h, g in pub["gains"].items():
        assert g == pytest.approx(pub["tput"][chapter.VLLM_HIT_PCT.index(h)] / pub["tput"][0], abs=0.002)
    assert pub["compute_s"][-1] / pub["load_s"][-1] == pytest.approx(pub["speedup_max"], rel=0.03)
    assert pub["compute_s"][0] / pub["load_s"][0] == pytest.approx(pub["speedup_min"], rel=0.25)
    assert kv.kv_bytes(M, chapter.VLLM_BLOCK_TOKENS, 1, "bf16") == pub["block_mb"] * 2**20
    assert np.all(np.diff(pub["compute_s"]) > 0) and np.all(np.diff(pub["tput"]) > 0)
    assert pub["setting"] == {"model": M, "gpu": G}


@pytest.fixture(scope="module")
def vo():
    return chapter.vllm_offload(M, G, 0.5, 8192)


def test_comparison_reads_the_published_rows(vo):
    v = vo["verdicts"]
    assert v["ttft"].verdict != claims.NOT_TESTABLE and v["throughput"].verdict != claims.NOT_TESTABLE
    refs = {c[0]: c[2] for c in v["ttft"].components}
    assert refs["speed-up at 100K tokens"] == data.published("vllm_offload_ttft_speedup_max")["value"]
    assert refs["recompute TTFT at 100K tokens"] == pytest.approx(
        data.published("vllm_offload_fig1_compute_ms_100k")["value"] / 1e3)
    refs = {c[0]: c[2] for c in v["throughput"].components}
    assert refs["throughput at 0% hits"] == data.published("vllm_offload_fig2_tput_h0")["value"]
    assert refs["gain at 90% hits"] == data.published("vllm_offload_fig2_gain_h90")["value"]
    np.testing.assert_allclose(vo["ttft"]["pub_load_s"], [
        data.published(f"vllm_offload_fig1_load_ms_{k}k")["value"] / 1e3 for k in chapter.VLLM_PROMPTS_K])
    # the computed components are the curves' own points
    assert vo["values"]["ttft"]["recompute TTFT at 100K tokens"] == vo["ttft"]["recompute_s"].iloc[-1]
    t = vo["tput"]["tokens_per_s"]
    assert vo["values"]["throughput"]["gain at 100% hits"] == pytest.approx(t.iloc[-1] / t.iloc[0])


def test_missing_effects_are_sized_from_the_published_points(vo):
    est, pub = vo["estimates"], vo["pub"]
    k = np.array(chapter.VLLM_PROMPTS_K[1:], dtype=float) * 1000
    slope, icpt = np.polyfit(k, pub["load_s"][1:], 1)
    assert est["fit_bw_bytes_s"] == pytest.approx(KV_TOK / slope)
    assert est["fit_fixed_s"] == pytest.approx(icpt)
    # the implied efficiency reproduces the published recompute TTFT at 100K
    r = lc.cpu_hit_ttft(M, G, [1e5], 1.0, compute_eff=est["eff_recompute"])
    assert r["recompute_s"][0] == pytest.approx(pub["compute_s"][-1], rel=1e-3)
    rows = dict((k, v) for k, v, _ in chapter.vllm_rows(vo, 0.5))
    assert "blog" in rows["ch2_vllm_ttft_text"] and "not estimated" not in rows["ch2_vllm_eff_text"]


def test_another_setting_says_no_published_figure():
    r = chapter.vllm_offload("Llama-3.1-70B", "H200-SXM-141GB", 0.5, 8192)
    for v in r["verdicts"].values():
        assert v.verdict == claims.NOT_TESTABLE and "no published figure for this setting" in v.label
    assert r["ttft"]["pub_compute_s"].isna().all() and r["tput"]["pub_tokens_per_s"].isna().all()
    rows = dict((k, v) for k, v, _ in chapter.vllm_rows(r, 0.5))
    assert "blog" not in rows["ch2_vllm_ttft_text"] and "not estimated" in rows["ch2_vllm_eff_text"]
