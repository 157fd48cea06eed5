"""Closed forms of the colocated closed-loop benchmark model (analysis.disagg.validate._agg): the wave
(synchronised clients), the steady chunked prefill (desynchronised), their mix, the client queue
(Little's law) and the memory cap, each against a hand-derived value from the operator costs, so that
deleting a term fails a test."""
import math

import numpy as np
import pytest

from analysis import forward as costs
from analysis import specs
from analysis.disagg import validate as V
from analysis.forward import Efficiency, Precision

MODEL = "Llama-3.1-8B"
H100 = "H100-SXM5-80GB"


def _setup(isl=1000.0, osl=200.0, c=16.0, bs=64.0, tp=1.0, cap=None):
    s = costs.shape(MODEL)
    hw = specs.gpu(H100)
    dev = {"flops": np.array([hw.flops("bf16")]), "attn_flops": np.array([hw.flops("bf16")]),
           "bw": np.array([hw["hbm_bandwidth"]]), "cap": np.array([cap or hw["hbm_capacity"]]),
           "link": np.array([hw["nvlink_bandwidth"] / 2]), "net": np.array([50e9])}
    g = {k: np.array([np.nan]) for k in V.NUMERIC}
    g.update(isl=np.array([isl]), osl=np.array([osl]), concurrency=np.array([c]), tp_size=np.array([tp]),
             attention_dp_size=np.array([1.0]), batch_size=np.array([bs]))
    g["sys_idx"], g["be_idx"] = np.array([0]), np.array([0])  # h100_sxm, trtllm
    prec = Precision(weight_bytes=np.array([2.0]), kv_bytes=np.array([2.0]), act_bytes=2.0, compute="bf16")
    return s, g, Efficiency(), prec, dev


def _cal(sync, chunk=8192.0, overhead=0.0):
    cal = V.Calibration()
    cal.sync = {b: sync for b in V.BACKENDS}
    cal.chunk_tokens = {b: chunk for b in V.BACKENDS}
    cal.ttft_overhead_s = {b: overhead for b in V.BACKENDS}
    return cal


def _run(s, eff, prec, dev, **kw):
    return float(np.asarray(costs.colocated_pass_time(s, prec, eff, dev, tp=1.0, dp=1.0, **kw)).ravel()[0])


def test_wave_closed_form():
    """sync = 1, c = A = 16 prompts of 1,000 tokens, chunks of 8,192: two full passes of 8,192 tokens;
    a request's first token after (W + t_req) / 2, its decode waits (W - TTFT) / (osl - 1) per token."""
    s, g, eff, prec, dev = _setup()
    ttft, tpot = V._agg(s, g, eff, prec, dev, _cal(1.0, overhead=0.05))
    t_chunk = _run(s, eff, prec, dev, pre_seqs=8.192, pre_len=1000.0, pre_prefix=0.0)
    t_dec = _run(s, eff, prec, dev, dec_seqs=16.0, dec_ctx=1100.0)
    W = math.ceil(16 * 1000 / 8192) * t_chunk
    ttft_w = (W + t_chunk) / 2
    assert ttft[0] == pytest.approx(ttft_w + 0.05, rel=1e-9)
    assert tpot[0] == pytest.approx(t_dec + (W - ttft_w) / 199, rel=1e-9)


def test_steady_closed_form():
    """sync = 0: TPOT the mean iteration (share f of mixed iterations), TTFT the larger of the prompt's
    chunks plus half a step and Little's law at the rate min(decode, prefill)."""
    s, g, eff, prec, dev = _setup()
    ttft, tpot = V._agg(s, g, eff, prec, dev, _cal(0.0))
    ps, pl = 8.192, 1000.0
    t_dec = _run(s, eff, prec, dev, dec_seqs=16.0, dec_ctx=1100.0)
    t_mix = _run(s, eff, prec, dev, dec_seqs=16.0, dec_ctx=1100.0, pre_seqs=ps, pre_len=pl, pre_prefix=0.0)
    f = min(16 * 1000 / (200 * ps * pl), 1.0)
    tpot_s = f * t_mix + (1 - f) * t_dec
    X = min(16 / (200 * tpot_s), ps * pl / (1000 * t_mix))
    assert tpot[0] == pytest.approx(tpot_s, rel=1e-9)
    assert ttft[0] == pytest.approx(max(t_mix + t_dec / 2, 16 / X - 199 * tpot_s), rel=1e-9)


def test_mix_is_linear_in_sync():
    s, g, eff, prec, dev = _setup()
    (a0, b0), (a1, b1), (ah, bh) = (V._agg(s, g, eff, prec, dev, _cal(x)) for x in (0.0, 1.0, 0.3))
    assert ah[0] == pytest.approx(0.7 * a0[0] + 0.3 * a1[0], rel=1e-9)
    assert bh[0] == pytest.approx(0.7 * b0[0] + 0.3 * b1[0], rel=1e-9)


def test_clients_beyond_the_engine_queue_by_littles_law():
    """c = 64 clients, batch 16: 48 wait; TTFT grows by 48 / X with X = A / (TTFT + (osl - 1) TPOT)
    of the engine's 16, and TPOT is unchanged."""
    s, g, eff, prec, dev = _setup(c=16.0, bs=16.0)
    t16, p16 = V._agg(s, g, eff, prec, dev, _cal(0.5))
    s, g, eff, prec, dev = _setup(c=64.0, bs=16.0)
    t64, p64 = V._agg(s, g, eff, prec, dev, _cal(0.5))
    X = 16 / (t16[0] + 199 * p16[0])
    assert p64[0] == pytest.approx(p16[0], rel=1e-12)
    assert t64[0] == pytest.approx(t16[0] + 48 / X, rel=1e-9)


def test_memory_caps_the_engine_concurrency():
    """With memory for 5 sequences beside the weights, 16 clients run 5 at a time: the same as a batch
    cap of 5."""
    s, g0, eff, prec, dev0 = _setup()
    w = float(np.ravel(costs.weight_bytes_per_device(s, prec, tp=1.0, n=1.0))[0])
    kv1 = float(np.ravel(costs.kv_bytes_per_device(s, prec, seqs=1.0, ctx=1200.0, tp=1.0, dp=1.0))[0])
    cap = (w + 5.5 * kv1) / (1 - eff.mem_reserve)
    s, g, eff, prec, dev = _setup(cap=cap)
    capped = V._agg(s, g, eff, prec, dev, _cal(0.5))
    s, g, eff, prec, dev = _setup(bs=5.0)
    batch5 = V._agg(s, g, eff, prec, dev0, _cal(0.5))
    assert capped[0][0] == pytest.approx(batch5[0][0], rel=1e-9)
    assert capped[1][0] == pytest.approx(batch5[1][0], rel=1e-9)


def _disagg_setup(cap, dbs=8.0, c=8.0):
    """One PD run of Llama-3.1-8B on H100s: one prefill and one decode worker (TP1), ``c`` clients,
    decode batch ``dbs``, device memory ``cap``."""
    s, g, eff, prec, dev = _setup(cap=cap)
    g.update(prefill_tp_size=np.array([1.0]), decode_tp_size=np.array([1.0]),
             prefill_num_workers=np.array([1.0]), decode_num_workers=np.array([1.0]),
             prefill_batch_size=np.array([1.0]), decode_batch_size=np.array([dbs]),
             concurrency=np.array([c]))
    return s, g, eff, prec, dev


def test_pd_decode_holds_the_recorded_batch_even_where_the_memory_estimate_says_less():
    """A PD run that records a decode batch of 8 and ran 8 clients held 8 sequences: a device whose
    memory estimate (weights plus KV under the flat reserve) leaves room for 1 must predict the same as
    an ample one (before the fix the estimate capped the batch at 1 and queued 7 clients, the rows that
    predicted 100x the measured TTFT); without a recorded batch the estimate still caps it."""
    s, _, eff, prec, _ = _setup()
    w = float(np.ravel(costs.weight_bytes_per_device(s, prec, tp=1.0, n=1.0))[0])
    kv1 = float(np.ravel(costs.kv_bytes_per_device(s, prec, seqs=1.0, ctx=1100.0, tp=1.0, dp=1.0))[0])
    tight = (w + 1.5 * kv1) / (1 - eff.mem_reserve)
    cal = _cal(0.5)
    small = V._disagg(*_disagg_setup(tight)[:2], eff, prec, _disagg_setup(tight)[4], cal)
    ample = V._disagg(*_disagg_setup(None)[:2], eff, prec, _disagg_setup(None)[4], cal)
    assert small[0][0] == pytest.approx(ample[0][0], rel=1e-9)
    assert small[1][0] == pytest.approx(ample[1][0], rel=1e-9)
    # no recorded batch: the memory estimate bounds the decode worker (1 sequence), 7 clients queue
    s, g, eff, prec, dev = _disagg_setup(tight, dbs=np.nan)
    unknown = V._disagg(s, g, eff, prec, dev, cal)
    assert unknown[0][0] > 3 * ample[0][0]
