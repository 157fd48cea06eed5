"""analysis.kv against closed forms for each attention family, and its properties."""
import numpy as np
import pytest

from analysis import kv, specs


def test_llama3_70b_bf16_closed_form():
    # 80 layers x 2 (K,V) x 8 KV heads x 128 x 2 bytes (Mooncake's 320 KB)
    assert kv.kv_bytes_per_token("Llama-3.1-70B", "bf16") == 80 * 2 * 8 * 128 * 2 == 327_680


def test_mha_closed_form_gpt2():
    # GPT-2 small: 12 layers x 2 x 12 heads x 64 x 2 bytes
    assert kv.kv_bytes_per_token("GPT-2 small", "bf16") == 12 * 2 * 12 * 64 * 2


def test_mqa_is_gqa_with_one_kv_head():
    m = specs.model("Llama-3.1-8B").replace(n_kv_heads=1)
    assert kv.kv_bytes_per_token(m, "fp16") == 32 * 2 * 1 * 128 * 2


def test_mla_latent_closed_form():
    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) x 2 bytes; independent of the 128 heads
    assert kv.kv_bytes_per_token("DeepSeek-V3", "bf16") == 61 * (512 + 64) * 2
    m = specs.model("DeepSeek-V3").replace(n_heads=64, n_kv_heads=64)
    assert kv.kv_bytes_per_token(m) == kv.kv_bytes_per_token("DeepSeek-V3")


@pytest.mark.parametrize("dtype,b", [("fp32", 4), ("bf16", 2), ("fp8", 1), ("int4", 0.5)])
def test_dtype_scaling(dtype, b):
    assert kv.kv_bytes_per_token("Qwen3-32B", dtype) == 64 * 2 * 8 * 128 * b


def test_sliding_window_saturates_closed_form():
    m = specs.model("Gemma-3-27B")  # 10 global + 52 local layers, window 1024, 16 KV heads x 128
    per_layer = 2 * 16 * 128 * 2
    for c in (512, 1024, 4096, 1 << 20):
        want = 10 * per_layer * c + 52 * per_layer * min(c, 1024)
        assert kv.kv_bytes(m, c, 1, "bf16") == want


def test_linear_layers_hold_constant_state():
    m = specs.model("Kimi-Linear-48B-A3B")
    state = 20 * 32 * 128 * 128 * 4  # 20 KDA layers, fp32 state
    assert kv.linear_state_bytes(m) == state
    c = np.array([1, 1000, 1 << 20])
    assert np.allclose(kv.kv_bytes(m, c), 7 * (512 + 64) * 2 * c + state)


@pytest.mark.parametrize("name", specs.model_names())
def test_kv_linear_in_context_and_batch_for_full_attention(name):
    m = specs.model(name)
    c = np.array([2 ** 20, 2 ** 21, 2 ** 22])  # beyond every window
    y = kv.kv_bytes(m, c, 1)
    slope = np.diff(y) / np.diff(c)
    assert np.allclose(slope, kv.kv_bytes_per_token(m))  # only full layers keep growing
    assert kv.kv_bytes(m, 5000, 3) == pytest.approx(3 * kv.kv_bytes(m, 5000, 1))


@pytest.mark.parametrize("name", specs.model_names())
def test_kv_monotone_and_saturating_parts_bounded(name):
    m = specs.model(name)
    c = np.unique(np.geomspace(1, 1 << 22, 200).astype(int))
    y = kv.kv_bytes(m, c)
    assert np.all(np.diff(y) >= 0)
    # never more than the all-full-attention counterfactual plus the fixed linear state
    assert np.all(y <= kv.kv_bytes_if_all_full(m, c) + kv.linear_state_bytes(m) + 1e-6)


@pytest.mark.parametrize("name", specs.model_names())
def test_param_count_matches_published_total(name):
    """The configuration fields reproduce each model's published parameter count (within 3%)."""
    m = specs.model(name)
    assert kv.param_counts(m)["total"] == pytest.approx(m.params_total_published, rel=0.03)


def test_attended_pairs_matches_brute_force():
    for n, p, w in [(7, 0, None), (5, 3, None), (9, 4, 3), (1, 10, 4), (6, 0, 2)]:
        brute = sum(min(t, w) if w else t for t in range(p + 1, p + n + 1))
        assert kv.attended_pairs(n, p, w) == brute


def test_prefill_flops_quadratic_term():
    m = "Llama-3.1-8B"
    lin = kv.matmul_flops_per_token(m)
    f1, f2 = kv.prefill_flops(m, 1000), kv.prefill_flops(m, 2000)
    # doubling tokens more than doubles FLOPs by exactly the attention term difference
    att = lambda n: 32 * 2 * 32 * (128 + 128) * n * (n + 1) / 2
    assert f1 == pytest.approx(lin * 1000 + att(1000))
    assert f2 - 2 * f1 == pytest.approx(att(2000) - 2 * att(1000))


def test_unknown_dtype_and_negative_context():
    with pytest.raises(ValueError, match="unknown dtype"):
        kv.kv_bytes_per_token("Llama-3.1-8B", "fp7")
    with pytest.raises(ValueError, match=">= 0"):
        kv.kv_bytes("Llama-3.1-8B", -1)


def test_block_sparse_attention_flops():
    n = 65536
    dense = kv.attention_core_flops("Llama-3.1-8B", n)
    full = kv.block_sparse_attention_core_flops("Llama-3.1-8B", n, n, 1024)
    gate = full - dense
    # attending to everything costs the dense core plus the gate: one score per query, head and
    # completed block, brute-force counted
    t = np.arange(1, n + 1)
    m = specs.model("Llama-3.1-8B")
    assert gate == pytest.approx(m.n_full_layers * 2 * m.n_heads * m.head_dim * np.floor(t / 1024).sum())
    # a window of w keys: brute-force pair count
    w = 3 * 1024
    sp = kv.block_sparse_attention_core_flops("Llama-3.1-8B", n, w, 1024) - gate
    assert sp == pytest.approx(kv.attention_core_flops_per_layer_token(m) * m.n_full_layers
                               * np.minimum(t, w).sum())
    # monotone in the attended keys, and 95% sparsity at 1M saves about 10x of the causal core
    a = [kv.block_sparse_attention_core_flops("Llama-3.1-8B", 1 << 20, x, 16384)
         for x in (16384, 49152, 1 << 20)]
    assert a[0] < a[1] < a[2]
    assert 9 < kv.attention_core_flops("Llama-3.1-8B", 1 << 20) / a[1] < 11
