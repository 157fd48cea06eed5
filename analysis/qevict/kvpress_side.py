"""The torch side of chapter 4's crosscheck (:mod:`analysis.qevict.crosscheck`): NVIDIA's kvpress
on Hugging Face transformers, SmolLM2 read from the project's GGUF file.

Runs only in the crosscheck environment (``make crosscheck``: ``.venv-crosscheck``, pinned in
``requirements-crosscheck.txt``) as ``python -m analysis.qevict.kvpress_side JOB.json``; the main
environment imports nothing of torch (this module imports torch inside its functions only).

For every document of the job and every stream (a press at a number of kept tokens, or the full
cache): a prefill of the first ``P`` tokens with the press active (kvpress compresses each layer's
cache in a forward hook right after that layer's attention, once, at the end of the prefill), then
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


def run_job(job: dict, out_dir: Path) -> dict:
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
    timing = dict(load_seconds=t_load, documents={})
    for doc in job["documents"]:
        ids = np.load(doc["ids"]).astype(np.int64)
        if len(ids) < P + D + 1:
            raise ValueError(f"{doc['name']}: {len(ids)} tokens, needs {P + D + 1}")
        t1 = time.perf_counter()
        logits, kept = {}, {}
        for spec in job["streams"]:
            key = spec["key"]
            cache = _fp16_cache()
            rec: dict = {}
            with torch.no_grad():
                ctx = torch.tensor(ids[None, :P])
                if spec["press"] == "full":
                    model.model(input_ids=ctx, past_key_values=cache)
                else:
                    press = _recording(_presses(spec, P), rec)
                    with press(model):
                        model.model(input_ids=ctx, past_key_values=cache)
                lg = np.zeros((D, model.config.vocab_size), np.float32)
                for s in range(D):
                    out = model(input_ids=torch.tensor([[int(ids[P + s])]]), past_key_values=cache,
                                position_ids=torch.tensor([[P + s]]))
                    lg[s] = out.logits[0, -1].float().numpy()
            logits[key] = lg
            if job.get("verbose", True):
                print(f"kvpress: {doc['name']} {key}: {time.perf_counter() - t1:.0f} s", flush=True)
            if rec:
                kept[key] = np.stack([rec[i] for i in range(len(rec))]).astype(np.int32)  # (L, Hkv, n)
            lens = {int(cache.layers[i].keys.shape[2]) for i in range(len(cache.layers))}
            if spec["press"] != "full" and lens != {int(spec["n_keep"]) + D}:
                raise AssertionError(f"{key}: cache lengths {lens}, expected {int(spec['n_keep']) + D}")
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
