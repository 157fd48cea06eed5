"""GPT-2 byte-level BPE tokenizer built from the GGUF's own vocabulary and merges.

SmolLM2 (llama.cpp pre-tokenizer ``smollm``) splits every digit into its own pre-token and then
applies the GPT-2 byte-level regex; tokens of GGUF type CONTROL become special tokens.
No BOS is added (``tokenizer.ggml.add_bos_token`` is false for this model).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

TOKEN_TYPE_CONTROL = 3


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str], token_types=None, eos_id: int | None = None,
                 bos_id: int | None = None, pre: str = "smollm"):
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

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

    @classmethod
    def from_gguf(cls, path: str | None = None) -> "Tokenizer":
        import gguf

        from .gguf_model import gguf_path

        r = gguf.GGUFReader(path or gguf_path())
        model = r.fields["tokenizer.ggml.model"].contents()
        if model != "gpt2":
            raise ValueError(f"tokenizer model {model!r} is not byte-level BPE ('gpt2')")
        tokens = r.fields["tokenizer.ggml.tokens"].contents()
        merges = r.fields["tokenizer.ggml.merges"].contents()
        types = r.fields["tokenizer.ggml.token_type"].contents()
        pre = r.fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in r.fields else "gpt2"
        eos = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
        bos = int(r.fields["tokenizer.ggml.bos_token_id"].contents())
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
