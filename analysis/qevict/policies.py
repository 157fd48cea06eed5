"""KV-cache policies at a fixed memory budget in bytes, deciding per window, layer and KV head.

Every policy manages *closed* windows of ``window`` tokens; the window being filled by decoding
(the open window) is always at full precision, and the first ``sink_windows`` windows (attention
sinks) are protected at full precision by every policy.  The budget is a fraction ``frac`` of
the bytes the full cache would hold: with ``nc`` closed windows, each (layer, KV head) may hold
``frac * (nc + 1)`` full windows' worth of bytes (the +1 reserves the open window).  Policies
re-decide when a window closes (every ``window`` decoding steps) and once after the prefill.

Scores are what the policy itself can observe: the attention its own (compressed) cache receives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kvcache import EVICTED, FULL, OFFLOADED, QUANT, digest_window_bytes
from .quant import full_window_bytes, quant_window_bytes

POLICIES = ("full", "streaming", "h2o", "tova", "snapkv", "kivi2", "kivi4", "mikv", "qevict_dequant",
            "qevict_recall", "quest", "h2o_recall", "snapkv_recall")
RECALL_POLICIES = ("qevict_recall", "quest", "h2o_recall", "snapkv_recall")  # keep exact copies off-device
POLICY_LABELS = {
    "full": "Full cache", "streaming": "StreamingLLM", "h2o": "H2O", "tova": "TOVA", "snapkv": "SnapKV",
    "kivi2": "KIVI 2-bit", "kivi4": "KIVI 4-bit", "mikv": "MiKV-style (no promotion)",
    "qevict_dequant": "QEvict (dequantize in place)", "qevict_recall": "QEvict (recall from cold tier)",
    "quest": "Quest (offloaded, top-k pages per step)", "h2o_recall": "H2O + recall (ArkVale-style)",
    "snapkv_recall": "SnapKV + recall (ArkVale-style)",
}


@dataclass(frozen=True)
class PolicyConfig:
    window: int = 32
    group: int = 32
    head_dim: int = 64
    sink_windows: int = 1
    qbits: int = 2  # bits of the quantized tier of MiKV / QEvict
    full_share: float = 0.5  # share of the budget for the full tier when windows must be evicted
    score_decay: float = 0.95  # per-step decay of the MiKV / QEvict accumulated attention
    snap_obs_tokens: int = 32  # SnapKV / QEvict observation window at the end of the prefill
    snap_kernel: int = 7  # SnapKV max-pool kernel (tokens)
    promote_margin: float = 0.0  # QEvict: a quantized window displaces a full one only if its score is
    # more than (1 + promote_margin) times the full window's (hysteresis against recall churn)

    def __post_init__(self):
        if self.window % self.group or self.head_dim % self.group:
            raise ValueError(f"group {self.group} must divide window {self.window} and head_dim {self.head_dim}")
        if not 0 < self.full_share <= 1:
            raise ValueError("full_share must be in (0, 1]")
        if not 0 < self.score_decay <= 1:
            raise ValueError("score_decay must be in (0, 1]")
        if self.sink_windows < 0:
            raise ValueError("sink_windows must be >= 0")
        if self.promote_margin < 0:
            raise ValueError("promote_margin must be >= 0")


def _top_mask(priority: np.ndarray, n) -> np.ndarray:
    """Boolean mask of the ``n`` largest entries along the last axis (n: int or array per row);
    ties broken towards later windows.  Entries of -inf are never selected."""
    m = priority.shape[-1]
    if m == 0:
        return np.zeros(priority.shape, bool)
    idx = np.arange(m)
    order = np.lexsort((-idx * np.ones_like(priority), -priority), axis=-1)  # desc priority, then later
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(idx, order.shape), axis=-1)
    n = np.asarray(n)
    if n.ndim:
        n = n[..., None]
    return (ranks < n) & (priority > -np.inf)


class Policy:
    name = "base"
    bits = 0  # bit width of this policy's quantized windows (0: never quantizes)
    promote = "none"
    uses_digest = False  # True: the cache estimates window attention from key digests (observe_estimate)
    step_pages = None  # Quest: windows loaded per step and (layer, KV head), set by target()

    def __init__(self, frac: float, cfg: PolicyConfig, n_layers: int, n_kv: int, n_windows: int):
        if not 0 < frac <= 1:
            raise ValueError(f"budget fraction must be in (0, 1], got {frac}")
        self.frac, self.cfg = frac, cfg
        self.F = full_window_bytes(cfg.window, cfg.head_dim)
        self.Qb = quant_window_bytes(cfg.window, cfg.head_dim, self.bits, cfg.group) if self.bits else 0
        self.r = self.Qb / self.F
        self.shape = (n_layers, n_kv, n_windows)
        self.fits = True  # False once a quantize-only policy had to evict to stay in budget

    # budget, in units of one full window, for the non-sink closed windows of one (layer, head)
    def capacity(self, nc: int) -> float:
        cap = self.frac * (nc + 1) - min(self.cfg.sink_windows, nc) - 1
        return cap

    def budget_bytes(self, nc: int) -> float:
        return self.frac * (nc + 1) * self.F

    def init(self, stats: dict):
        """``stats``: prefill attention reduced to windows, each (L, Hkv, NWp): ``colsum`` (all
        queries), ``obs`` (last ``snap_obs_tokens`` queries), ``snap`` (obs, max-pooled), ``last``."""

    def observe(self, win_attn: np.ndarray):
        """Attention of the current query on this stream's own cache, (L, Hkv, NW), mean over the
        query heads of each KV head."""

    def observe_estimate(self, win_est: np.ndarray):
        """Digest-estimated attention share of every window (L, Hkv, NW), held or not (policies
        with ``uses_digest``)."""

    def extra_device_bytes(self, nc: int) -> float:
        """Device bytes per (layer, KV head) beyond the windows' tiers: key digests, Quest's pages."""
        return 0.0

    def target(self, tier: np.ndarray, nc: int) -> np.ndarray:
        raise NotImplementedError

    # helpers
    def _split(self, tier, nc):
        s = min(self.cfg.sink_windows, nc)
        new = tier.copy()
        new[..., :s] = FULL
        cand = tier[..., s:nc]
        return new, s, cand


class FullCache(Policy):
    name = "full"

    def target(self, tier, nc):
        return tier


class _EvictByPriority(Policy):
    """Keep the ``floor(cap)`` highest-priority windows at full precision, evict the rest."""

    def priority(self, nc: int) -> np.ndarray:  # (L, Hkv, nc - sinks)
        raise NotImplementedError

    def target(self, tier, nc):
        new, s, cand = self._split(tier, nc)
        if cand.shape[-1] == 0:
            return new
        n = int(np.floor(self.capacity(nc) + 1e-9))
        if n < 0:
            raise ValueError(f"budget {self.frac:.0%} cannot hold the sink and open windows")
        pr = self.priority(nc).astype(np.float64)
        pr = np.where(cand == EVICTED, -np.inf, pr)
        keep = _top_mask(pr, n)
        new[..., s:nc] = np.where(keep & (cand != EVICTED), FULL, EVICTED)
        return new


class StreamingLLM(_EvictByPriority):
    name = "streaming"

    def priority(self, nc):
        s = min(self.cfg.sink_windows, nc)
        return np.broadcast_to(np.arange(s, nc, dtype=float), self.shape[:2] + (nc - s,))


class H2O(_EvictByPriority):
    """Heavy hitters by accumulated attention (all prefill queries + every decoding step), half of
    the budget for the most recent windows (as in the H2O paper)."""
    name = "h2o"

    def init(self, stats):
        self.score = np.zeros(self.shape)
        self.score[..., : stats["colsum"].shape[-1]] = stats["colsum"]

    def observe(self, win_attn):
        self.score += win_attn

    def priority(self, nc):
        s = min(self.cfg.sink_windows, nc)
        pr = self.score[..., s:nc].copy()
        n = int(np.floor(self.capacity(nc) + 1e-9))
        n_recent = n // 2
        if n_recent:
            pr[..., -n_recent:] = np.inf
        return pr


class TOVA(_EvictByPriority):
    """Evict the windows the current query attends to least (TOVA, at window granularity)."""
    name = "tova"

    def init(self, stats):
        self.last = np.zeros(self.shape)
        self.last[..., : stats["last"].shape[-1]] = stats["last"]

    def observe(self, win_attn):
        self.last = win_attn.astype(np.float64)

    def priority(self, nc):
        s = min(self.cfg.sink_windows, nc)
        return self.last[..., s:nc]


class SnapKV(_EvictByPriority):
    """One-shot selection at the end of the prefill by the pooled attention of the observation
    window; the observation window and every decoded window rank above all other prompt windows
    (newest first) when later windows close."""
    name = "snapkv"

    def init(self, stats):
        self.nwp = stats["snap"].shape[-1]
        self.snap = stats["snap"]
        self.n_obs = -(-self.cfg.snap_obs_tokens // self.cfg.window)

    def priority(self, nc):
        s = min(self.cfg.sink_windows, nc)
        L, H = self.shape[:2]
        pr = np.empty((L, H, nc - s))
        w = np.arange(s, nc)
        prompt = w < self.nwp
        pr[..., prompt] = self.snap[..., w[prompt]]
        pr[..., (w >= self.nwp - self.n_obs) & prompt] = 1e6 + w[(w >= self.nwp - self.n_obs) & prompt]
        pr[..., ~prompt] = 2e6 + w[~prompt]
        return pr


class KIVI(Policy):
    """Quantize every closed non-sink window; spend what is left of the budget on keeping the most
    recent closed windows at full precision (KIVI's full-precision residual).  If even quantizing
    everything does not fit, the oldest windows are evicted and ``fits`` becomes False."""
    name = "kivi"

    def target(self, tier, nc):
        new, s, cand = self._split(tier, nc)
        m = cand.shape[-1]
        if m == 0:
            return new
        cap = self.capacity(nc)
        if cap < 0:
            raise ValueError(f"budget {self.frac:.0%} cannot hold the sink and open windows")
        alive = cand != EVICTED
        n_alive = alive.sum(-1)  # same for every row by construction
        k = np.floor((cap - n_alive * self.r) / (1 - self.r) + 1e-9).astype(int)
        n_keep = n_alive.copy()
        if np.any(k < 0):
            self.fits = False
            n_keep = np.minimum(n_alive, np.floor(cap / self.r + 1e-9).astype(int))
            k = np.zeros_like(k)
        k = np.clip(k, 0, None)
        pr = np.where(alive, np.arange(m, dtype=float), -np.inf)  # recency
        keep = _top_mask(pr, n_keep) & alive
        full = _top_mask(pr, k) & keep & (cand == FULL)  # a quantized window is never re-promoted
        new[..., s:nc] = np.where(full, FULL, np.where(keep, QUANT, EVICTED))
        return new


class KIVI2(KIVI):
    name, bits = "kivi2", 2


class KIVI4(KIVI):
    name, bits = "kivi4", 4


class ThreeTier(Policy):
    """MiKV-style (``promote='none'``) and QEvict (``'dequant'`` / ``'recall'``) three-tier cache.

    Importance of a window: attention of the last ``snap_obs_tokens`` prefill queries, then
    ``score = score_decay * score + attention`` at every decoding step.  At each re-decision:

    * if every retained window fits at full precision, all stay full;
    * else if all retained windows fit with some quantized, the most important ones stay (or, with
      promotion, become) full and the rest are quantized: nothing is evicted;
    * else ``full_share`` of the budget goes to the full tier (half of it to the most recent
      windows, as H2O, half by importance), the rest to the quantized tier by importance, and the
      least important windows are evicted.

    Without promotion a quantized window can only stay quantized or be evicted; with promotion a
    quantized window whose importance ranks it into the full tier is promoted, by dequantizing it
    in place or by recalling its exact copy from the cold tier.
    """
    name = "threetier"

    def __init__(self, frac, cfg, n_layers, n_kv, n_windows, promote="none"):
        self.bits = cfg.qbits
        super().__init__(frac, cfg, n_layers, n_kv, n_windows)
        if promote not in ("none", "dequant", "recall"):
            raise ValueError(f"promote must be none, dequant or recall, got {promote!r}")
        self.promote = promote

    def init(self, stats):
        self.score = np.zeros(self.shape)
        self.score[..., : stats["obs"].shape[-1]] = stats["obs"]

    def observe(self, win_attn):
        self.score *= self.cfg.score_decay
        self.score += win_attn

    def target(self, tier, nc):
        new, s, cand = self._split(tier, nc)
        m = cand.shape[-1]
        if m == 0:
            return new
        cap = self.capacity(nc)
        if cap < 0:
            raise ValueError(f"budget {self.frac:.0%} cannot hold the sink and open windows")
        alive = cand != EVICTED
        n_alive = alive.sum(-1)
        r = self.r
        sc = np.where(alive, self.score[..., s:nc], -np.inf)
        if self.promote == "none":
            full_ok = alive & (cand == FULL)
        else:
            full_ok = alive
        # number of full windows per row
        if np.all(n_alive <= cap + 1e-9):
            n_full = n_alive
            n_keep = n_alive
        else:
            n_full_retain = np.floor((cap - n_alive * r) / (1 - r) + 1e-9).astype(int)
            evict_rows = n_full_retain < 0
            nf_evict = int(np.floor(self.cfg.full_share * cap + 1e-9))
            n_full = np.where(evict_rows, nf_evict, n_full_retain)
            n_keep = n_alive.copy()
        # choose full windows: half recent, half by score
        pr_full = np.where(full_ok, sc, -np.inf)
        if self.promote != "none" and self.cfg.promote_margin > 0:  # hysteresis: incumbents keep their place
            pr_full = np.where(cand == FULL, pr_full * (1 + self.cfg.promote_margin), pr_full)
        n_recent = n_full // 2
        # the n_recent newest full-eligible windows get top priority
        rec_rank = np.cumsum(full_ok[..., ::-1], -1)[..., ::-1]  # 1 for newest eligible
        recent = full_ok & (rec_rank <= np.asarray(n_recent)[..., None])
        pr_full = np.where(recent, np.inf, pr_full)
        full = _top_mask(pr_full, n_full) & full_ok
        n_full_used = full.sum(-1)
        # quantized tier: by score among the rest
        n_q = np.floor((cap - n_full_used) / r + 1e-9).astype(int) if r > 0 else np.zeros_like(n_full_used)
        n_q = np.minimum(n_q, n_keep - n_full_used)
        pr_q = np.where(alive & ~full, sc, -np.inf)
        quant = _top_mask(pr_q, n_q) & alive & ~full
        new[..., s:nc] = np.where(full, FULL, np.where(quant, QUANT, EVICTED))
        return new


class MiKV(ThreeTier):
    name = "mikv"

    def __init__(self, frac, cfg, n_layers, n_kv, n_windows):
        super().__init__(frac, cfg, n_layers, n_kv, n_windows, promote="none")


class QEvictDequant(ThreeTier):
    name = "qevict_dequant"

    def __init__(self, frac, cfg, n_layers, n_kv, n_windows):
        super().__init__(frac, cfg, n_layers, n_kv, n_windows, promote="dequant")


class QEvictRecall(ThreeTier):
    name = "qevict_recall"

    def __init__(self, frac, cfg, n_layers, n_kv, n_windows):
        super().__init__(frac, cfg, n_layers, n_kv, n_windows, promote="recall")


class _Offloading(Policy):
    """Policies that keep every window they do not hold off the device (exact, recallable) and
    rank windows with key digests kept on the device (``digest_window_bytes`` per window and head,
    counted in the budget)."""
    promote = "recall"
    uses_digest = True

    def fits_all(self, nc: int) -> bool:
        """Every closed window fits at full precision: nothing goes off the device, no digest needed."""
        return nc - min(self.cfg.sink_windows, nc) <= self.capacity(nc) + 1e-9

    def extra_device_bytes(self, nc):
        if self.fits_all(nc):
            return 0.0
        s = min(self.cfg.sink_windows, nc)
        return (nc - s) * digest_window_bytes(self.cfg.head_dim)

    def n_hold(self, nc: int) -> int:
        """Windows held at full precision per (layer, head) after the digests of the closed windows."""
        n = int(np.floor(self.capacity(nc) - _Offloading.extra_device_bytes(self, nc) / self.F + 1e-9))
        if n < 0:
            raise ValueError(f"budget {self.frac:.0%} cannot hold the sink and open windows and the digests")
        return n


class Quest(_Offloading):
    """Quest-style query-aware page selection with the cache offloaded: every closed non-sink window
    lives off the device; at every decoding step, for every layer and KV head, the ``k`` windows
    whose digest bound (largest possible logit of the current query) is highest are loaded and read
    exactly, ``k`` as many as the budget holds after the sinks, the open window and the digests.
    The window unit of this book replaces Quest's 16-token pages."""
    name = "quest"
    uses_digest = False

    def extra_device_bytes(self, nc):
        return super().extra_device_bytes(nc) + max(self.step_pages or 0, 0) * self.F

    def target(self, tier, nc):
        new, s, cand = self._split(tier, nc)
        if self.fits_all(nc):  # everything on the device, as Quest on a short context
            self.step_pages = 0
            if np.any(cand == OFFLOADED):
                raise AssertionError("the budget grows with the context: offloaded windows stay offloaded")
            return new
        self.step_pages = self.n_hold(nc)
        new[..., s:nc] = np.where(cand == EVICTED, EVICTED, OFFLOADED)
        return new


class _RecallByPriority(_Offloading):
    """Hold the ``n`` highest-priority windows on the device at full precision and keep the rest
    off the device; a window that ranks back into the top ``n`` is recalled (ArkVale-style)."""

    def priority(self, nc: int) -> np.ndarray:
        raise NotImplementedError

    def target(self, tier, nc):
        new, s, cand = self._split(tier, nc)
        if cand.shape[-1] == 0:
            return new
        n = self.n_hold(nc)
        pr = np.where(cand == EVICTED, -np.inf, self.priority(nc).astype(np.float64))
        keep = _top_mask(pr, n) & (cand != EVICTED)
        new[..., s:nc] = np.where(keep, FULL, np.where(cand == EVICTED, EVICTED, OFFLOADED))
        return new


class H2ORecall(_RecallByPriority):
    """H2O whose evicted windows go off the device instead of being dropped.  The accumulated score
    starts from the prefill's column sums (as H2O) and then adds, every step, each window's attention
    share estimated from its key digest (held or not, so offloaded windows can climb back, as in
    ArkVale); half of the held windows are the most recent."""
    name = "h2o_recall"

    def init(self, stats):
        self.score = np.zeros(self.shape)
        self.score[..., : stats["colsum"].shape[-1]] = stats["colsum"]

    def observe_estimate(self, win_est):
        self.score += win_est

    def priority(self, nc):
        s = min(self.cfg.sink_windows, nc)
        pr = self.score[..., s:nc].copy()
        n_recent = self.n_hold(nc) // 2
        if n_recent:
            pr[..., -n_recent:] = np.inf
        return pr


class SnapKVRecall(_RecallByPriority):
    """SnapKV's one-shot selection after the prefill; afterwards, at each re-decision, windows are
    ranked by their digest-estimated attention accumulated since the previous re-decision (the
    recent queries' importance, ArkVale's ranking), so offloaded windows that the recent queries
    need are recalled."""
    name = "snapkv_recall"

    def init(self, stats):
        self.snap = SnapKV(self.frac, self.cfg, *self.shape)
        self.snap.init(stats)
        self.recent = np.zeros(self.shape)
        self.n_obs_steps = 0

    def observe_estimate(self, win_est):
        self.recent += win_est
        self.n_obs_steps += 1

    def priority(self, nc):
        if self.n_obs_steps == 0:
            return self.snap.priority(nc)
        s = min(self.cfg.sink_windows, nc)
        pr = self.recent[..., s:nc].copy()
        self.recent[:] = 0
        self.n_obs_steps = 0
        return pr


REGISTRY = {c.name: c for c in (FullCache, StreamingLLM, H2O, TOVA, SnapKV, KIVI2, KIVI4, MiKV, QEvictDequant,
                                 QEvictRecall, Quest, H2ORecall, SnapKVRecall)}
assert tuple(REGISTRY) == POLICIES


def make_policy(name: str, frac: float, cfg: PolicyConfig, n_layers: int, n_kv: int, n_windows: int) -> Policy:
    if name not in REGISTRY:
        raise ValueError(f"unknown policy {name!r}; policies: {', '.join(POLICIES)}")
    return REGISTRY[name](frac, cfg, n_layers, n_kv, n_windows)
