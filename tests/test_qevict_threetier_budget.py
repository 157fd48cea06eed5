"""The three-tier policies (MiKV, QEvict-dequant, QEvict-recall) approach the full cache as the budget
grows, as decisions alone (no model): with the same importance scores, a larger budget never evicts more
windows; once nothing must be evicted, a larger budget never holds fewer windows at full precision; and a
budget that holds every window exactly keeps them all exact.  Issue 14 asks this of every three-tier
policy; chapter 4 tests the outcome (KL) with analysis.qevict.longview.BUDGET_TREND_RULE."""
import numpy as np
import pytest

from analysis.qevict.kvcache import EVICTED, FULL, QUANT
from analysis.qevict.policies import PolicyConfig, make_policy

L, H, NC = 2, 3, 40
FRACS = np.round(np.arange(0.08, 1.0001, 0.02), 4)


def _decide(name, frac, cfg, scores, tier=None):
    p = make_policy(name, float(frac), cfg, L, H, NC + 1)
    p.init(dict(obs=scores, colsum=scores, snap=scores, last=scores))
    tier = np.full((L, H, NC + 1), FULL, np.int8) if tier is None else tier
    return p, p.target(tier, NC)


@pytest.mark.parametrize("name", ["mikv", "qevict_dequant", "qevict_recall"])
@pytest.mark.parametrize("qbits,full_share", [(2, 0.5), (4, 0.25), (4, 0.75), (3, 0.5)])
def test_three_tier_moves_towards_the_full_cache_as_the_budget_grows(name, qbits, full_share):
    cfg = PolicyConfig(window=32, group=32, qbits=qbits, full_share=full_share)
    scores = np.random.default_rng(qbits).dirichlet(np.ones(NC + 1), size=(L, H))
    prev_ev, prev_full, prev_regime = None, None, None
    for f in FRACS:
        p, new = _decide(name, f, cfg, scores)
        c = new[..., 1:NC]  # the non-sink closed windows
        n_full, n_q, n_ev = ((c == t).sum(-1) for t in (FULL, QUANT, EVICTED))
        assert np.all(n_full + p.r * n_q <= p.capacity(NC) + 1e-9)  # within the budget
        if prev_ev is not None:
            assert np.all(n_ev <= prev_ev), f"budget {f:.0%} evicts more than the budget below"
        retain = bool(np.all(n_ev == 0))
        if retain and prev_regime:
            assert np.all(n_full >= prev_full), f"budget {f:.0%} holds fewer exact windows than below"
        if NC - 1 <= p.capacity(NC) + 1e-9:  # everything fits exactly
            assert np.all(c == FULL)
        prev_ev, prev_full, prev_regime = n_ev, n_full, retain
    assert prev_regime and np.all(prev_full == NC - 1)  # at 100%: the full cache


def test_without_eviction_every_spare_byte_goes_to_exact_windows():
    """Once nothing is evicted the exact windows use the budget to within one window: the quantized
    tier shrinks as the budget grows, which is why the policy approaches the full cache."""
    cfg = PolicyConfig(window=32, group=32, qbits=4, full_share=0.5)
    scores = np.random.default_rng(0).dirichlet(np.ones(NC + 1), size=(L, H))
    for f in (0.5, 0.7, 0.9):
        p, new = _decide("qevict_recall", f, cfg, scores)
        c = new[..., 1:NC]
        n_full, n_q = (c == FULL).sum(-1), (c == QUANT).sum(-1)
        assert np.all(n_full + n_q == NC - 1)
        used = n_full + p.r * n_q
        assert np.all(p.capacity(NC) - used < 1 - p.r + 1e-9)  # one more exact window would not fit
