"""The models' shared output head (analysis.qevict.lmhead): a bad logits mode fails before the
forward pass, and the chunked NLL equals the log-softmax of the full logits, on both architectures."""
import numpy as np
import pytest

from analysis.qevict.lmhead import LOGITS_MODES, head_outputs
from tests._tiny_model import tiny_gemma, tiny_llama, tiny_tokens


class _NoForward:
    """A capture that fails if the forward pass reaches any attention."""

    def on_attention(self, *a):
        raise AssertionError("the forward pass ran before the logits mode was checked")


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma])
def test_bad_mode_fails_before_the_forward_pass(make):
    model = make()
    ids = tiny_tokens(24)
    with pytest.raises(ValueError, match="logits must be"):
        model.prefill(ids, logits="bogus", capture=_NoForward())
    with pytest.raises(ValueError, match="needs targets"):
        model.prefill(ids, logits="nll", capture=_NoForward())
    with pytest.raises(ValueError, match="needs targets"):
        model.prefill(ids, logits="nll", targets=ids[1:], capture=_NoForward())


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma])
def test_modes_agree_with_the_full_logits(make):
    model = make()
    ids = tiny_tokens(40)
    full = model.prefill(ids, logits="all")["logits"]
    assert full.shape == (len(ids), model.cfg.vocab_size)
    np.testing.assert_allclose(model.prefill(ids, logits="last")["logits"], full[-1], rtol=1e-5, atol=1e-5)
    none = model.prefill(ids, logits="none")
    assert "logits" not in none and "nll" not in none
    tg = np.r_[ids[1:], -1]
    nll = model.prefill(ids, logits="nll", targets=tg)["nll"]
    lg = full.astype(np.float64)
    lsm = lg - lg.max(-1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
    assert np.isnan(nll[-1])  # target -1: skipped
    np.testing.assert_allclose(nll[:-1], -lsm[np.arange(len(ids) - 1), tg[:-1]], rtol=1e-5, atol=1e-5)


def test_nll_chunks_cover_every_row():
    """Rows in chunks of any size (a last, partial chunk too) give the same NLL."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 8)).astype(np.float32)
    w = rng.standard_normal((8, 50)).astype(np.float32)
    tg = rng.integers(-1, 50, 37)
    outs = [head_outputs(x, "nll", tg, lambda h: h @ w, chunk)["nll"] for chunk in (1, 5, 37, 64)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-12)
    assert np.array_equal(np.isnan(outs[0]), tg < 0)
    assert set(LOGITS_MODES) == {"all", "last", "none", "nll"}
