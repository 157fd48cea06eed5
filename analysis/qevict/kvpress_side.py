"""The torch side of chapter 4's crosscheck (:mod:`analysis.qevict.crosscheck`): NVIDIA's kvpress
on Hugging Face transformers, SmolLM2 read from the project's GGUF file.

Runs only in the crosscheck environment (``make crosscheck``: ``.venv-crosscheck``, pinned in
``requirements-crosscheck.txt``) as ``python -m analysis.qevict.kvpress_side JOB.json``; the main
environment imports nothing of torch (this module imports torch inside its functions only).

For every document of the job and every stream (a press at a number of kept tokens, or the full
cache): a prefill of the first ``P`` tokens, compressed by the press as kvpress's forward hook does
(each layer's cache right after that layer's attention, once, at the end of the prefill; the prefill
is shared by the presses, and checked against kvpress's own context manager: :func:`run_job`), then
``D`` teacher-forced decoding steps at their true positions (kvpress keeps the original RoPE
positions of the kept keys; decoded tokens are appended, never compressed). K and V are rounded to
float16 when they enter the cache, as the numpy model does (its cache is accounted at 2 bytes per
element), so the prefill attention, the presses' scores and the decoding read the same values.
Writes one ``.npz`` per document: the logits of every stream at every step (float32) and, per
stream, the positions each (layer, KV head) kept.
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from pathlib import Path

import numpy as np


def n_kept_ratio(n_keep: int, k_len: int) -> float:
    """kvpress's ``compression_ratio`` that keeps exactly ``n_keep`` of ``k_len`` tokens
    (``int(k_len * (1 - ratio))``; the half token guards against float rounding)."""
    if not 0 < n_keep <= k_len:
        raise ValueError(f"n_keep {n_keep} must be in 1..{k_len}")
    return 1.0 - (n_keep + 0.5) / k_len if n_keep < k_len else 0.0


def window_snap_scores(attn: np.ndarray, *, obs: int, kernel: int, window: int, n_kv: int,
                       sink_windows: int) -> np.ndarray:
    """The project's SnapKV ranking (``runner.window_stats`` + ``policies.SnapKV``) as per-token
    scores, from one layer's prefill attention ``attn`` (H, T, T): the last ``obs`` queries' attention
    summed per key, max-pooled over ``kernel`` keys (zero padding), averaged over the query heads of a
    KV head and summed per window of ``window`` tokens; sink windows and the observation windows rank
    above every other window (later first), and every token of a window gets its window's score, so
    keeping a multiple of ``window`` tokens keeps whole windows.  Returns (n_kv, T)."""
    H, T, _ = attn.shape
    o = attn[:, T - obs:, :].sum(1)  # (H, T)
    if kernel > 1:
        pad = np.zeros((H, kernel // 2), o.dtype)
        p = np.concatenate([pad, o, np.zeros((H, kernel - 1 - kernel // 2), o.dtype)], 1)
        o = np.lib.stride_tricks.sliding_window_view(p, kernel, axis=1).max(-1)
    g = H // n_kv
    nw = T // window
    w = o.reshape(n_kv, g, T).mean(1).reshape(n_kv, nw, window).sum(-1).astype(np.float64)
    idx = np.arange(nw)
    n_obs = -(-obs // window)
    w[:, idx >= nw - n_obs] = 1e6 + idx[idx >= nw - n_obs]
    w[:, idx < sink_windows] = 2e6 + idx[idx < sink_windows]
    return np.repeat(w, window, axis=1)


def _presses(spec: dict, P: int):
    """The kvpress press of one stream (``spec``: name, n_keep and the press's settings)."""
    import kvpress  # optional heavy dependency
    import torch  # optional heavy dependency
    from kvpress.presses.scorer_press import ScorerPress  # optional heavy dependency

    name, ratio = spec["press"], n_kept_ratio(int(spec["n_keep"]), P)
    kw = dict(spec.get("kwargs", {}))
    if name == "WindowSnapKVPress":  # the project's SnapKV definition, as a kvpress scorer

        class WindowSnapKVPress(ScorerPress):
            def score(self, module, hidden_states, keys, values, attentions, kwargs):
                if attentions is None:
                    raise RuntimeError("WindowSnapKVPress needs attention weights "
                                       "(attn_implementation='eager')")
                a = attentions[0].double().numpy()
                s = window_snap_scores(a, n_kv=keys.shape[1], **kw)
                return torch.from_numpy(s).to(keys.dtype)[None]

        return WindowSnapKVPress(compression_ratio=ratio)
    return getattr(kvpress, name)(compression_ratio=ratio, **kw)


def _recording(press, kept: dict):
    """Record, per layer, the positions the scorer ``press`` keeps (the top ``n_kept`` scores, as
    :class:`kvpress.presses.scorer_press.ScorerPress.compress` selects them)."""
    from kvpress.utils import compute_n_kept  # optional heavy dependency

    orig = press.score

    def score(module, hidden_states, keys, values, attentions, kwargs):
        s = orig(module, hidden_states, keys, values, attentions, kwargs)
        n = compute_n_kept(keys.shape[2], press.compression_ratio)
        kept[module.layer_idx] = np.sort(s.topk(n, dim=-1).indices[0].numpy(), -1)
        return s

    press.score = score
    return press


def _fp16_cache():
    from transformers import DynamicCache  # optional heavy dependency

    class FP16KVCache(DynamicCache):
        """K/V rounded to float16 on entry (the numpy model's cache precision)."""

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            return super().update(key_states.half().float(), value_states.half().float(), layer_idx,
                                  cache_kwargs)

    return FP16KVCache()


def _prefill(model, ids: np.ndarray):
    """Full-attention prefill of ``ids`` into a float16-rounded cache, recording what kvpress's forward
    hook hands each press at every attention layer: its input hidden states, its attention weights
    and the rotary embeddings.  Returns ([(keys, values)] per layer, [(module, hidden, attn, pe)])."""
    import torch  # optional heavy dependency

    cache, seen = _fp16_cache(), []

    def hook(module, args, kwargs, output):
        seen.append((module, kwargs["hidden_states"], output[1], kwargs["position_embeddings"]))

    layers = model.model.layers
    hooks = [ly.self_attn.register_forward_hook(hook, with_kwargs=True) for ly in layers]
    try:
        with torch.no_grad():
            model.model(input_ids=torch.tensor(ids[None]), past_key_values=cache)
    finally:
        for h in hooks:
            h.remove()
    return [(ly.keys, ly.values) for ly in cache.layers], seen


def _compressed(model, press, kv, seen):
    """The cache kvpress's forward hook (``BasePress.forward_hook``) leaves after the prefill: every
    layer's keys and values through ``press.compress`` with the hook's arguments."""
    import torch  # optional heavy dependency

    press.post_init_from_model(model)
    cache = _fp16_cache()
    with torch.no_grad():
        for li, ((k, v), (module, hs, attn, pe)) in enumerate(zip(kv, seen)):
            module.rotary_emb = model.model.rotary_emb  # as BasePress.__call__ sets it
            k2, v2 = press.compress(module, hs, k, v, attn, dict(hidden_states=hs, position_embeddings=pe))
            cache.update(k2, v2, li)
    return cache


def _decode(model, cache, ids: np.ndarray, P: int, D: int) -> np.ndarray:
    """``D`` teacher-forced steps at their true positions (as kvpress's pipeline passes them)."""
    import torch  # optional heavy dependency

    lg = np.zeros((D, model.config.vocab_size), np.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # one-token steps: small matmuls; robust on shared cores
    with torch.no_grad():
        for s in range(D):
            out = model(input_ids=torch.tensor([[int(ids[P + s])]]), past_key_values=cache,
                        position_ids=torch.tensor([[P + s]]))
            lg[s] = out.logits[0, -1].float().numpy()
    torch.set_num_threads(n)
    return lg


def _hook_path(model, spec, ids, P, D):
    """One stream through kvpress's own context manager (its forward hooks during the prefill)."""
    import torch  # optional heavy dependency

    rec: dict = {}
    cache = _fp16_cache()
    press = _recording(_presses(spec, P), rec)
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor(ids[None, :P]), past_key_values=cache)
    return np.stack([rec[i] for i in range(len(rec))]), _decode(model, cache, ids, P, D)


def run_job(job: dict, out_dir: Path) -> dict:
    """Every document and stream of ``job``.  One full-attention prefill per document is shared by
    all presses (each layer's prefill reads only its own full cache; kvpress compresses a layer after
    its attention), each press compressing it as its forward hook would; on the first document the
    streams marked ``hook_check`` also run through kvpress's own context manager, and the two paths
    must keep the same positions with the same logits."""
    import torch  # optional heavy dependency
    from transformers import AutoModelForCausalLM  # optional heavy dependency

    torch.set_num_threads(int(job.get("threads", 2)))
    path = Path(job["gguf"])
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    t_load = time.perf_counter() - t0
    P, D = int(job["prefill_tokens"]), int(job["decode_tokens"])
    timing = dict(load_seconds=t_load, documents={}, hook_check={})
    for di, doc in enumerate(job["documents"]):
        ids = np.load(doc["ids"]).astype(np.int64)
        if len(ids) < P + D + 1:
            raise ValueError(f"{doc['name']}: {len(ids)} tokens, needs {P + D + 1}")
        t1 = time.perf_counter()
        kv, seen = _prefill(model, ids[:P])
        logits, kept = {}, {}
        for spec in job["streams"]:
            key = spec["key"]
            rec: dict = {}
            if spec["press"] == "full":
                cache = _fp16_cache()
                for li, (k, v) in enumerate(kv):
                    cache.update(k, v, li)
            else:
                cache = _compressed(model, _recording(_presses(spec, P), rec), kv, seen)
                kept[key] = np.stack([rec[i] for i in range(len(rec))]).astype(np.int32)  # (L, Hkv, n)
                lens = {int(ly.keys.shape[2]) for ly in cache.layers}
                if lens != {int(spec["n_keep"])}:
                    raise AssertionError(f"{key}: cache lengths {lens}, expected {int(spec['n_keep'])}")
            logits[key] = _decode(model, cache, ids, P, D)
            if di == 0 and spec.get("hook_check"):
                hk, hl = _hook_path(model, spec, ids, P, D)
                chk = dict(kept_identical=bool(np.array_equal(hk, kept[key])),
                           max_logit_diff=float(np.abs(hl - logits[key]).max()))
                timing["hook_check"][key] = chk
                if not chk["kept_identical"]:
                    raise AssertionError(f"{key}: kvpress's hook path keeps other positions than compress()")
            if job.get("verbose", True):
                print(f"kvpress: {doc['name']} {key}: {time.perf_counter() - t1:.0f} s", flush=True)
        del kv, seen
        np.savez(out_dir / f"{doc['name']}.npz", **{f"logits/{k}": v for k, v in logits.items()},
                 **{f"kept/{k}": v for k, v in kept.items()})
        timing["documents"][doc["name"]] = time.perf_counter() - t1
        print(f"kvpress: {doc['name']}: {len(job['streams'])} streams in "
              f"{timing['documents'][doc['name']]:.0f} s", flush=True)
    import transformers  # optional heavy dependency

    timing["versions"] = dict(torch=torch.__version__, transformers=transformers.__version__,
                              kvpress=importlib.metadata.version("kvpress"))
    return timing


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m analysis.qevict.kvpress_side JOB.json  (run by `make crosscheck`)")
    job_file = Path(argv[0])
    job = json.loads(job_file.read_text())
    out = Path(job["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    info = run_job(job, out)
    (out / "timing.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
