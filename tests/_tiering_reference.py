"""The slow, obviously-correct prefix-cache LRU simulator that the one-pass curve must equal.

One capacity per call. A list ordered from least to most recently used; nothing clever."""
from __future__ import annotations


def lru_prefix_hits(requests, capacity_blocks, block_tokens=None):
    """``requests``: list of lists of block ids. Returns (hit_blocks, hit_tokens).

    A request's hit = its leading blocks present in the cache when it arrives. Then each of its
    blocks, in order, becomes the most recently used (inserted if absent; when the cache holds more
    than ``capacity_blocks`` blocks, the least recently used is dropped)."""
    cache = []  # index 0 = least recently used
    hit_blocks = 0
    hit_tokens = 0
    for r, blocks in enumerate(requests):
        for k, b in enumerate(blocks):
            if b in cache:
                hit_blocks += 1
                hit_tokens += block_tokens[r][k] if block_tokens is not None else 0
            else:
                break
        for b in blocks:
            if b in cache:
                cache.remove(b)
            cache.append(b)
            if len(cache) > capacity_blocks:
                cache.pop(0)
    return hit_blocks, hit_tokens


def lru_prefix_hits_fast(requests, capacity_blocks, block_tokens=None):
    """The same simulator with an OrderedDict (identical logic, fast enough for the real trace)."""
    from collections import OrderedDict

    cache = OrderedDict()
    hit_blocks = 0
    hit_tokens = 0
    for r, blocks in enumerate(requests):
        for k, b in enumerate(blocks):
            if b in cache:
                hit_blocks += 1
                hit_tokens += block_tokens[r][k] if block_tokens is not None else 0
            else:
                break
        for b in blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
            if len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hit_blocks, hit_tokens
