"""KIVI-style quantization: error bounds per bit width and byte accounting."""
import numpy as np
import pytest

from analysis.qevict.quant import (
    full_window_bytes,
    quant_error_bound,
    quant_window_bytes,
    quantize_keys,
    quantize_values,
)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quant_error_within_bound(bits, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((5, 32, 64)) * rng.uniform(0.1, 10, size=(5, 1, 64))).astype(np.float32)
    x[0, :, 3] = 1.5  # a constant channel: zero range
    kq = quantize_keys(x, bits, 32)
    bound_k = quant_error_bound(x.reshape(5, 1, 32, 64), bits, axis=-2).reshape(5, 1, 64)
    assert np.all(np.abs(kq - x) <= bound_k + 1e-6)
    vq = quantize_values(x, bits, 32)
    bound_v = quant_error_bound(x.reshape(5, 32, 2, 32), bits, axis=-1).reshape(5, 32, 2, 1)
    assert np.all(np.abs(vq - x).reshape(5, 32, 2, 32) <= bound_v + 1e-6)


def test_error_shrinks_with_bits():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32, 64)).astype(np.float32)
    errs = [np.abs(quantize_keys(x, b, 32) - x).mean() for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True)
    assert errs[-1] < 0.02 * errs[0]


def test_quantize_idempotent():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 32, 64)).astype(np.float32)
    for b in (2, 4):
        k = quantize_keys(x, b, 32)
        np.testing.assert_allclose(quantize_keys(k, b, 32), k, atol=1e-5)
        v = quantize_values(x, b, 32)
        np.testing.assert_allclose(quantize_values(v, b, 32), v, atol=1e-5)


def test_bytes():
    assert full_window_bytes(32, 64) == 2 * 32 * 64 * 2
    # codes: 2 * 32 * 64 * 2 bits = 1024 B; keys 64 groups, values 64 groups, 2 x fp16 each = 512 B
    assert quant_window_bytes(32, 64, 2, 32) == 1024 + 512
    assert quant_window_bytes(32, 64, 4, 32) == 2048 + 512
    assert quant_window_bytes(32, 64, 4, 16) == 2048 + 4 * (64 * 2 + 32 * 4)


def test_bad_group():
    x = np.zeros((32, 64), np.float32)
    with pytest.raises(ValueError):
        quantize_keys(x, 2, 24)
    with pytest.raises(ValueError):
        quantize_values(x, 5, 32)
