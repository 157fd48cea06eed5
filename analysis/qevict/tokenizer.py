"""Tokenizers built from a GGUF's own vocabulary.

* ``tokenizer.ggml.model == "gpt2"`` (SmolLM2): GPT-2 byte-level BPE from the GGUF's vocabulary and
  merges.  SmolLM2 (llama.cpp pre-tokenizer ``smollm``) splits every digit into its own pre-token and
  then applies the GPT-2 byte-level regex; tokens of GGUF type CONTROL become special tokens.  No BOS
  is added (``tokenizer.ggml.add_bos_token`` is false for this model).
* ``tokenizer.ggml.model == "llama"`` (Gemma 3): SentencePiece BPE.  The GGUF has no merges, only
  scores; SentencePiece merges, among adjacent pieces, the pair whose concatenation has the highest
  score, which is the same as BPE with merges ranked by the merged piece's score (how Hugging Face
  converts SentencePiece BPE models).  Spaces become U+2581, unknown bytes fall back to ``<0xXX>``
  tokens, no space prefix is added (``add_space_prefix`` false); USER_DEFINED tokens (newline and
  space runs, ...) are matched before BPE as llama.cpp does, CONTROL tokens are special.  A BOS
  token starts every document when ``add_bos_token`` is true (:attr:`Tokenizer.prefix`).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from analysis.cache import cache_dir

from .gguf_model import gguf_path
from .ggufread import read_gguf

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str], token_types=None, eos_id: int | None = None,
                 bos_id: int | None = None, pre: str = "smollm"):
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ValueError("duplicate tokens in vocabulary")
        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"malformed merge {m!r}")
            pairs.append((a, b))
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
        tk = HFTokenizer(bpe)
        pres = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if pre in ("smollm", "gpt2-digits"):
            pres.insert(0, pre_tokenizers.Digits(individual_digits=True))
        elif pre != "gpt2":
            raise ValueError(f"unsupported pre-tokenizer {pre!r}")
        tk.pre_tokenizer = pre_tokenizers.Sequence(pres)
        tk.decoder = decoders.ByteLevel()
        if token_types is not None:
            special = [tokens[i] for i, tt in enumerate(token_types) if int(tt) == TOKEN_TYPE_CONTROL]
            tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
        self._tk = tk
        self.vocab_size = len(tokens)
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.prefix = np.zeros(0, np.int64)  # token ids that start every document

    @classmethod
    def sentencepiece_bpe(cls, tokens, scores, token_types, eos_id=None, bos_id=None, add_bos=False):
        """SentencePiece BPE (see the module docstring) as a Hugging Face ``tokenizers`` BPE.  Deriving
        the merges takes minutes for a 262K vocabulary, so the result is cached on disk
        (``analysis.cache`` directory) keyed by the vocabulary's content."""
        types = np.asarray(token_types)
        scores = np.asarray(scores, dtype=np.float64)
        h = hashlib.sha256("\0".join(tokens).encode("utf-8", "surrogatepass"))
        h.update(scores.tobytes())
        h.update(types.astype(np.int64).tobytes())
        path = cache_dir() / "tokenizers" / f"spm-bpe-{h.hexdigest()[:32]}.json"
        if path.is_file():
            tk = HFTokenizer.from_str(path.read_text(encoding="utf-8"))
        else:
            tk = cls._build_spm_bpe(tokens, scores, types)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".partial")
            tmp.write_text(tk.to_str(), encoding="utf-8")
            tmp.replace(path)
        self = cls.__new__(cls)
        self._tk, self.vocab_size, self.eos_id, self.bos_id = tk, len(tokens), eos_id, bos_id
        self.prefix = np.array([bos_id] if add_bos and bos_id is not None else [], np.int64)
        return self

    @staticmethod
    def _build_spm_bpe(tokens, scores, types):
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = []
        for i, t in enumerate(tokens):
            if types[i] != 1 or len(t) < 2:
                continue
            for k in range(1, len(t)):
                a, b = t[:k], t[k:]
                ia, ib = vocab.get(a), vocab.get(b)
                if ia is not None and ib is not None and types[ia] == 1 and types[ib] == 1:
                    merges.append((-scores[i], i, ia, ib, a, b))
        merges.sort()
        unk = next((t for t, ty in zip(tokens, types) if ty == 2), None)
        bpe = models.BPE(vocab=vocab, merges=[(m[4], m[5]) for m in merges], unk_token=unk, fuse_unk=True,
                         byte_fallback=True)
        tk = HFTokenizer(bpe)
        tk.normalizer = normalizers.Replace(" ", "\u2581")
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                       decoders.Fuse()])
        tk.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                       for i in np.nonzero(types == TOKEN_TYPE_USER_DEFINED)[0]])
        tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                               for i in np.nonzero(types == TOKEN_TYPE_CONTROL)[0]])
        return tk

    @classmethod
    def from_gguf(cls, path: str | None = None) -> "Tokenizer":
        r = read_gguf(path or gguf_path())
        model = r.fields["tokenizer.ggml.model"]

        def opt(key, default=None):
            return r.fields.get(key, default)

        if model == "llama":
            if opt("tokenizer.ggml.add_space_prefix", True):
                raise NotImplementedError("SentencePiece tokenizers with a space prefix are not supported")
            return cls.sentencepiece_bpe(
                r.fields["tokenizer.ggml.tokens"], r.fields["tokenizer.ggml.scores"],
                r.fields["tokenizer.ggml.token_type"], eos_id=opt("tokenizer.ggml.eos_token_id"),
                bos_id=opt("tokenizer.ggml.bos_token_id"),
                add_bos=bool(opt("tokenizer.ggml.add_bos_token", False)))
        if model != "gpt2":
            raise ValueError(f"tokenizer model {model!r} is not byte-level BPE ('gpt2')")
        tokens = r.fields["tokenizer.ggml.tokens"]
        merges = r.fields["tokenizer.ggml.merges"]
        types = r.fields["tokenizer.ggml.token_type"]
        pre = opt("tokenizer.ggml.pre", "gpt2")
        eos = int(r.fields["tokenizer.ggml.eos_token_id"])
        bos = int(r.fields["tokenizer.ggml.bos_token_id"])
        return cls(tokens, merges, types, eos_id=eos, bos_id=bos, pre=pre)

    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError("text must be str")
        return np.asarray(self._tk.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_to_str(self, i: int) -> str:
        return self._tk.id_to_token(int(i))


@lru_cache(maxsize=2)
def load_tokenizer(path: str | None = None) -> Tokenizer:
    return Tokenizer.from_gguf(path)
