"""Chapter 4's numpy Llama: tokenizer, greedy facts, perplexity, prefill == decode.

The forward-pass logic (prefill == decode through the cache, input checks) runs on a tiny random-weight
model of the same architecture (tests/_tiny_model.py); what is about SmolLM2's weights (its shape,
facts, perplexity, and one prefill == decode on the real model) is marked ``real_weights``."""
import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from analysis.qevict import corpora  # noqa: E402
from analysis.qevict.gguf_model import gguf_path  # noqa: E402

try:
    gguf_path()
except FileNotFoundError as e:  # pragma: no cover
    pytest.skip(str(e), allow_module_level=True)

from analysis.qevict.gguf_model import load_model  # noqa: E402
from analysis.qevict.kvcache import MultiStreamCache  # noqa: E402
from analysis.qevict.tokenizer import load_tokenizer  # noqa: E402
from tests._tiny_model import tiny_llama, tiny_tokens  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def greedy(model, tok, prompt, n):
    ids = list(tok.encode(prompt))
    for _ in range(n):
        ids.append(int(model.prefill(ids, logits="last")["logits"].argmax()))
    return tok.decode(ids[len(tok.encode(prompt)):])


@pytest.mark.real_weights
def test_model_shape(model):
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_model) == (30, 9, 3, 64, 576)
    assert c.vocab_size == 49152 and c.context_length == 8192


@pytest.mark.parametrize("text", [
    "Hello, world! The quick brown fox jumps over 13 lazy dogs.",
    "def f(x):\n    return x ** 2  # squared\n\n\n\tindented\r\n",
    "Ünïcödé — “quotes” 日本語 🙂 and digits 0123456789",
    "",
    "<|im_start|>user\nhi<|im_end|>",
])
def test_tokenizer_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_tokenizer_round_trip_stdlib(tok):
    src = corpora.module_source("textwrap")
    ids = tok.encode(src)
    assert tok.decode(ids) == src
    assert len(ids) < len(src) / 2  # a real BPE, not bytes


def test_tokenizer_digits_split(tok):
    ids = tok.encode("12345")
    assert len(ids) == 5


@pytest.mark.real_weights
@pytest.mark.parametrize("prompt,expect", [
    ("The capital of France is", "Paris"),
    ("The capital of Japan is", "Tokyo"),
])
def test_greedy_completion_knows_facts(model, tok, prompt, expect):
    assert expect in greedy(model, tok, prompt, 4)


def _ppl(model, ids):
    out = model.prefill(ids, logits="nll", targets=np.r_[ids[1:], -1])
    return float(np.exp(np.nanmean(out["nll"])))


@pytest.mark.real_weights
def test_perplexity_python_source(model, tok):
    ids = tok.encode(corpora.module_source("argparse"))[:512]
    assert 4.0 < _ppl(model, ids) < 25.0


@pytest.mark.real_weights
def test_perplexity_english_text(model, tok):
    ids = tok.encode(corpora.module_docstrings("statistics"))[:512]
    assert 3.0 < _ppl(model, ids) < 40.0


def _prefill_equals_decode(model, ids, P):
    full = model.prefill(ids, logits="all")["logits"]
    pre = model.prefill(ids[:P], logits="last")
    # float32 with different matmul blockings, through fp16-rounded K/V: equal to ~1e-3
    np.testing.assert_allclose(pre["logits"], full[P - 1], rtol=1e-3, atol=2e-2)
    cache = MultiStreamCache(model.cfg, 1, pre["k"], pre["v"], len(ids), window=16, bits=0, group=16)
    for pos in range(P, len(ids)):
        lg = model.decode_step(int(ids[pos]), pos, cache)
        np.testing.assert_allclose(lg[0], full[pos], rtol=1e-3, atol=2e-2)
        assert lg[0].argmax() == full[pos].argmax()


def test_prefill_equals_step_by_step_decode():
    """Three decoded windows after a two-window prompt (the open window crosses window boundaries)."""
    _prefill_equals_decode(tiny_llama(), tiny_tokens(80), 32)


@pytest.mark.real_weights
def test_prefill_equals_step_by_step_decode_real_weights(model, tok):
    """The same on SmolLM2's weights (their magnitudes through the fp16 K/V), one decoded window."""
    ids = tok.encode(corpora.module_source("functools"))[:49]
    _prefill_equals_decode(model, ids, 32)


def test_bad_input():
    model = tiny_llama()
    with pytest.raises(ValueError):
        model.prefill([])
    with pytest.raises(ValueError):
        model.prefill([1, 2, model.cfg.vocab_size])
    with pytest.raises(ValueError):
        model.prefill([1, 2], logits="bogus")
