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


def test_prefill_time_monotone():
    t = roofline.prefill_time("Llama-3.1-70B", "H800-SXM5-80GB", np.array([512, 1024, 4096]), 8192, n_gpus=8)
    assert np.all(np.diff(t) > 0)
    fast = specs.gpu("H800-SXM5-80GB").replace(bf16_flops=2 * specs.gpu("H800-SXM5-80GB")["bf16_flops"])
    slow = roofline.prefill_time("Llama-3.1-70B", "H800-SXM5-80GB", 4096, 0)
    assert roofline.prefill_time("Llama-3.1-70B", fast, 4096, 0) < slow


def test_load_bandwidth_needed_is_kv_over_time():
    bw = roofline.prefix_load_bandwidth_needed("Llama-3.1-70B", "A800-SXM4-80GB", 8192, 1024, n_gpus=8)
    t = roofline.prefill_time("Llama-3.1-70B", "A800-SXM4-80GB", 1024, 8192, n_gpus=8)
    assert bw == pytest.approx(kv.kv_bytes("Llama-3.1-70B", 8192) / t)
