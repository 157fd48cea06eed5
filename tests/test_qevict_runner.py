"""Input checks of :func:`analysis.qevict.runner.run_document` that must fail before any work."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from analysis.qevict.policies import PolicyConfig
from analysis.qevict.runner import run_document


class NoWork:
    """A model whose prefill must not run: the check under test fails first."""

    cfg = SimpleNamespace(n_layers=2, n_heads=6, n_kv_heads=2, head_dim=32, context_length=4096)
    gguf_file = None

    def prefill(self, *a, **k):
        raise AssertionError("prefill ran")


@pytest.mark.parametrize("span", [(120, 130), (128, 130)])
def test_free_running_span_inside_the_prefill_rejected_before_any_work(span):
    with pytest.raises(ValueError, match=f"span {span[0]}:{span[1]} must start after the prefill"):
        run_document(NoWork(), np.zeros(200, int), 128, 40, ["streaming"], [0.5],
                     PolicyConfig(head_dim=32, window=16, group=16), free_run_spans=[(140, 150), span])


def test_no_streams_rejected_before_any_work():
    with pytest.raises(ValueError, match="no streams to run"):
        run_document(NoWork(), np.zeros(200, int), 128, 40, [], [0.5],
                     PolicyConfig(head_dim=32, window=16, group=16), include_full=False)
