import numpy as np
import pytest

from analysis import kv, roofline, specs


def test_op_time_is_max_of_compute_and_memory():
    assert roofline.op_time(2e12, 1e9, 1e12, 1e12) == pytest.approx(2.0)
    assert roofline.op_time(1e9, 3e12, 1e12, 1e12) == pytest.approx(3.0)
    assert roofline.op_time(1e9, 3e12, 1e12, 1e12, bw_eff=0.5, overhead_s=1) == pytest.approx(7.0)


def test_decode_gemv_bandwidth_bound_and_prefill_gemm_compute_bound():
    g = specs.gpu("H100-SXM5-80GB")
    f, b = roofline.gemm(1, 8192, 8192)
    assert not roofline.is_compute_bound(f, b, g.flops("bf16"), g["hbm_bandwidth"])
    f, b = roofline.gemm(8192, 8192, 8192)
    assert roofline.is_compute_bound(f, b, g.flops("bf16"), g["hbm_bandwidth"])


def test_mooncake_eq2_is_the_papers_closed_form():
    """Eq. 2 as the paper writes it: KV bytes of the prefix times the GPUs' FLOP/s over the prefill
    FLOPs; faster GPUs need proportionally more bandwidth, longer prefixes less (quadratic term)."""
    m, g = "Llama-3.1-70B", "A800-SXM4-80GB"
    G = 8 * specs.gpu(g).flops("bf16") * 0.5
    want = kv.kv_bytes(m, 8192) * G / kv.prefill_flops(m, 8192)
    got = roofline.mooncake_eq2_bandwidth(m, g, 8192, n_gpus=8, compute_eff=0.5)
    assert got == pytest.approx(want, rel=1e-12)
    bw = roofline.mooncake_eq2_bandwidth(m, "H800-SXM5-80GB", np.array([512, 8192, 65536]), n_gpus=8)
    assert np.all(np.diff(bw) < 0)
    fast = specs.gpu("H800-SXM5-80GB").replace(bf16_flops=2 * specs.gpu("H800-SXM5-80GB")["bf16_flops"])
    assert roofline.mooncake_eq2_bandwidth(m, fast, 8192) == pytest.approx(
        2 * roofline.mooncake_eq2_bandwidth(m, "H800-SXM5-80GB", 8192), rel=1e-12)
    with pytest.raises(ValueError, match="prefix_tokens"):
        roofline.mooncake_eq2_bandwidth(m, g, 0)
