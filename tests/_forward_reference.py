"""A plain, scalar, loop-over-layers reference of the forward-pass cost model (analysis.forward), written
from the formulas in its docstrings rather than from its code: every term of one colocated forward pass
(projections, attention core with decode and prefill pairs priced at their own rates, KV reads,
sliding windows, dense FFN, MoE experts + router, LM head, TP all-reduce, EP all-to-all, dense gather,
context parallelism, overheads). Used by tests/test_forward_terms.py: removing or altering any term of
the vectorised model makes them disagree. Linear-attention layers are not covered (no test model has them)."""
from __future__ import annotations

import math


def _op(f, b, peak, bw, eff):
    return max(f / (peak * eff.compute), b / (bw * eff.bandwidth))


def _pairs(n_new, prefix, window=None):
    tot = 0
    for t in range(int(prefix) + 1, int(prefix) + int(n_new) + 1):
        tot += t if window is None else min(t, window)
    return float(tot)


def _hier(bytes_leaving, n, link, net, domain, eff):
    """Bytes a device sends spread evenly over the other n-1 devices of its group: those for devices
    inside its scale-up domain go over the link, the rest over the NIC, both at once."""
    if n <= 1:
        return 0.0
    inside = min(n, domain) - 1
    f_in = inside / (n - 1)
    return max(bytes_leaving * f_in / (link * eff.link), bytes_leaving * (1 - f_in) / (net * eff.link))


def pass_time(s, prec, eff, dev, *, tp, dp, B=0, ctx=0, P=0, L=0, X=0):
    """Seconds of one forward pass on one device of an instance of ``tp * dp`` devices holding ``B``
    decoding sequences at context ``ctx`` and ``P`` prefill chunks of ``L`` tokens after ``X`` cached."""
    peak, bw, apk = dev["flops"], dev["bw"], dev.get("attn_flops", dev["flops"])
    link, net, domain = dev["link"], dev.get("net", dev["link"]), dev.get("domain", math.inf)
    wb, kb, ab = prec.weight_bytes, prec.kv_bytes, prec.act_bytes
    n = tp * dp
    T = B + P * L                      # new tokens in the pass
    seqs = B + P
    kv_read = B * ctx + P * X          # cached tokens read per full layer
    split = min(tp, s.kv_split_max)
    total = 0.0
    layer_kinds = ["full"] * s.n_full + ["sliding"] * s.n_sliding
    for kind in layer_kinds:
        # projections
        total += _op(2 * (T / dp) * s.attn_params / tp, s.attn_params * wb / tp + (T / dp) * s.h * ab * 2,
                     peak, bw, eff)
        w = None if kind == "full" else s.window
        dec_pairs = B * ((ctx + 1) if w is None else min(ctx + 1, w))
        pre_pairs = P * _pairs(L, X, w) if P else 0.0
        flops = (dec_pairs * s.pair_flops_decode + pre_pairs * s.pair_flops_prefill) / dp / tp
        read = kv_read if w is None else min(kv_read, seqs * w)
        total += _op(flops, (read + T) / dp * s.kv_elems * kb / split, apk, bw, eff)
    for _ in range(s.n_dense):
        total += _op(2 * T * s.dense_params / n, s.dense_params * wb / n + 2 * T * s.h * ab, peak, bw, eff)
    for _ in range(s.n_moe):
        E, k = s.n_experts, s.k_active
        mine = math.ceil(E / n)  # routed experts on the fullest device
        touched = mine * (1 - (1 - k / E) ** T)
        f = (2 * T * k * s.expert_params * mine / E * eff.moe_imbalance
             + 2 * T * s.n_shared * s.expert_params / n + 2 * T * s.h * E / n)
        b = (touched + s.n_shared) * s.expert_params * wb + s.h * E * wb + T * (k + 1) * s.h * ab * 2 / n
        total += _op(f, b, peak, bw, eff)
    # LM head and embedding gather
    total += _op(2 * seqs * s.vocab * s.h / n, s.vocab * s.h * wb / n + T * s.h * ab, peak, bw, eff)
    # communication
    if tp > 1:  # two ring all-reduces per layer
        total += 2 * s.n_layers * (2 * (tp - 1) / tp * (T / dp) * s.h * ab / (link * eff.link)
                                   + eff.collective_latency_s)
    if s.n_moe and n > 1:  # dispatch + combine per MoE layer to the distinct devices of each token's experts
        dest = n * (1 - (1 - 1 / n) ** s.k_active)
        leaving = 2 * (T / dp) * dest * s.h * ab * (n - 1) / n * eff.moe_imbalance  # busiest device
        total += s.n_moe * (_hier(leaving, n, link, net, domain, eff) + 2 * eff.collective_latency_s)
    if not s.n_moe and dp > 1:  # dense FFN over all n devices: gather / scatter around it
        total += s.n_layers * (2 * (T / dp) * s.h * ab / (link * eff.link) + eff.collective_latency_s)
    if P and P < dp:  # context parallelism: ring exchange of the prompt's KV
        total += (s.n_full + s.n_sliding) * P * L * (dp - 1) / dp * s.kv_elems * kb / (link * eff.link)
    return total + eff.step_overhead_s + s.n_layers * eff.layer_overhead_s
