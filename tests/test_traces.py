"""Properties of analysis.traces.Trace that the chapters quote."""
import numpy as np

from analysis.traces import from_requests


def _req(blocks):
    return {"timestamp": 0, "input_length": 512 * len(blocks), "output_length": 1, "hash_ids": blocks}


def test_single_use_share_counts_distinct_blocks_seen_once():
    # blocks 1 and 2 are reused by the second request, 3 and 4 are seen once: 2 of 4 distinct blocks
    tr = from_requests([_req([1, 2, 3]), _req([1, 2, 4])])
    assert tr.single_use_share() == 0.5
    # reuse by any later request counts, not only by the next one
    tr = from_requests([_req([1]), _req([2]), _req([1])])
    assert np.isclose(tr.single_use_share(), 0.5)


def test_single_use_share_bounds():
    assert from_requests([_req([1, 2])]).single_use_share() == 1.0
    assert from_requests([_req([7]), _req([7])]).single_use_share() == 0.0
