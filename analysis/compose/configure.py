"""The library objects of chapter 5's typed configuration (:class:`~analysis.compose.params.ComposeConfig`,
made by ``analysis.compose.params.SCHEMA.config(values)``): the base scenario, the reuse curve, the KV
policies measured by chapter 4 and the declared fidelity floor."""
from __future__ import annotations

from ..cache import cached
from ..tiering import configure as _tiering_configure
from ..tiering import params as _tiering_params
from .decide import FidelityFloor
from .fidelity import (
    in_drive_policy,
    long_context_runs,
    measure,
    with_long_context,
    with_source,
    write_measurement,
)
from .params import SCHEMA, ComposeConfig, Recall
from .pipeline import Scenario, SequentialRecall
from .pricing import RandomReadRecall, routed_reuse


def tier_deployment():
    """Chapter 2's tier deployment at its chapter defaults (prices from data/hardware.csv)."""
    return _tiering_configure.deployment(_tiering_params.SCHEMA.config())


def recall_model(r: Recall):
    """The recall pricing of a configuration's :class:`~analysis.compose.params.Recall` group."""
    if r.recall_pricing == "sequential":
        return SequentialRecall()
    return RandomReadRecall.from_deployment(tier_deployment(), unit_tokens=int(r.recall_unit_tokens),
                                            prefetch=bool(r.recall_prefetch))


def base_scenario(c: ComposeConfig) -> Scenario:
    """The chapter's base :class:`~analysis.compose.pipeline.Scenario` (at the sensitivity analyses'
    reference context and hit rate)."""
    s = c.service
    return Scenario(model=s.model, gpu=s.gpu, input_tokens=c.sensitivity.ref_context,
                    output_tokens=s.output_tokens, hit_rate=c.sensitivity.ref_hit_rate,
                    ttft_slo_s=s.ttft_slo_s, tpot_slo_s=s.tpot_slo_s, budget_devices=s.budget_devices,
                    tiers=tier_deployment(), gpu_cost_basis=s.gpu_cost_basis,
                    recall_model=recall_model(c.recall))


def reuse(c: ComposeConfig):
    """The reuse curve: chapter 2's routing-dependent hit rate of ``trace`` under ``routing_policy``
    at ``routing_instances`` (0: the replay's busy instances), or the ideal single stack
    (``routing_policy = 'ideal'``)."""
    r = c.reuse
    return routed_reuse(r.trace, int(r.routing_instances) or None, r.routing_policy, model=c.service.model,
                        gpu=c.service.gpu)


def kv_policies(c: ComposeConfig, verbose: bool = False, source: str | None = None):
    """The full cache and every (policy, budget) of the configuration, measured by chapter 4 (bytes
    from the short fidelity run; fidelity from chapter 4's committed long-context runs where they cover
    a policy and ``fidelity_long_context`` is on), with the fidelity of ``source`` (default: the
    ``fidelity_source`` parameter) for the served model (see
    :func:`analysis.compose.fidelity.with_source`)."""
    f = c.fidelity
    kw = measurement_kwargs(c)
    # chapter 4's short runs are cached on disk run by run, but loading them takes half a minute; chapter 5,
    # its evidence page and the front page each need the same policies, so the result is cached whole
    # (keyed on these inputs and the code of the experiment); `verbose` shows the runs, so it recomputes
    measured = measure(**kw, verbose=True) if verbose else cached("compose_measured_policies", measure, **kw)
    if f.fidelity_long_context:
        measured = with_long_context(measured, long_context_runs())
    return with_source(measured, source or f.fidelity_source, model=c.service.model)


def measurement_kwargs(c: ComposeConfig) -> dict:
    """The arguments of :func:`analysis.compose.fidelity.measure` for configuration ``c``."""
    f = c.fidelity
    return dict(policies=list(f.kv_policies), budgets=[float(b) for b in f.kv_budgets],
                documents=list(f.fidelity_documents), prefill_tokens=int(f.fidelity_prefill_tokens),
                decode_tokens=int(f.fidelity_decode_tokens))


def write_default_measurement():
    """``make default-run``: chapter 5's measurement at its default parameters, committed
    (``results/compose_measured_policies``, :func:`analysis.compose.fidelity.write_measurement`)."""
    return write_measurement(**measurement_kwargs(SCHEMA.config(SCHEMA.defaults())))


def fidelity_floor(c: ComposeConfig, policies, source: str | None = None) -> FidelityFloor:
    """The declared floor, with the AI SSD's in-drive quantization at every stored precision the
    chapter uses (chapter 2's default and ``ai_ssd_bits_grid``) as a KV policy."""
    f = c.fidelity
    src = source or f.fidelity_source
    bits = set(c.sensitivity.ai_ssd_bits_grid) | {int(_tiering_params.SCHEMA["ai_ssd_bits"].default)}
    return FidelityFloor(f.fidelity_floor_top1, f.fidelity_max_ppl_change, f.fidelity_min_score_ratio,
                         in_drive={b: in_drive_policy(b, policies, src, model=c.service.model)
                                   for b in sorted(bits)})
