"""Chapter 4's typed configuration as the engine's: the :class:`~analysis.qevict.policies.PolicyConfig`
every policy stream of the experiment (:mod:`.experiment`), the tuning search (:mod:`.tuning`) and
the long runs (:mod:`.longrun`) start from."""
from __future__ import annotations

from collections.abc import Mapping

from ..params import group
from .params import HEAD_DIM, Policies, QEvictConfig
from .policies import PolicyConfig


def policy_config(c: QEvictConfig | Policies | Mapping, head_dim: int = HEAD_DIM) -> PolicyConfig:
    """The policies' shared knobs of a configuration (its :class:`~analysis.qevict.params.Policies`
    group). A mapping is a long run's row (:mod:`analysis.qevict.longrun`) or the tuning search's
    parameters: it holds every knob of the group, unvalidated (long runs go beyond the chapter's
    ranges), and may give the model's ``head_dim``."""
    if isinstance(c, Mapping):
        head_dim = int(c["head_dim"]) if "head_dim" in c else head_dim
        c = group(Policies, c)
    k = c.policies if isinstance(c, QEvictConfig) else c
    return PolicyConfig(window=k.window_tokens, group=k.group_size, head_dim=head_dim,
                        sink_windows=k.sink_windows, qbits=k.qevict_bits, full_share=k.full_share,
                        score_decay=k.score_decay, snap_obs_tokens=k.snap_obs_tokens,
                        snap_kernel=k.snap_kernel)
