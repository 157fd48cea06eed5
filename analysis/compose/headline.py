"""The book's headline figure for the front page: chapter 5's decision map at chapter 5's default
parameters, one panel (the SSD prices of ``data/hardware.csv``) so that it is legible at page width.

The front page cannot show chapter 5's figure itself (glue from another page renders text only), so it
re-draws it with the same code and defaults; chapter 4's fidelity runs are read from the on-disk
result cache that chapter 5 shares, so the cost is the map itself (seconds).
"""
from __future__ import annotations

from .. import params
from . import decide, figures, pipeline
from .params import base_scenario, kv_policies

CHAPTER = "05_where_kv_lives"


def default_map(price_factor: float = 1.0):
    """(cells, parameters) of chapter 5's decision map at its defaults, at one SSD price factor."""
    P = params.defaults(CHAPTER)
    base = base_scenario(P)
    floor = decide.FidelityFloor(P["fidelity_floor_top1"], P["fidelity_max_ppl_change"])
    reuse = pipeline.reuse_curve_from_trace(P["trace"])
    opts = decide.options(P["layouts"], kv_policies(P), P["modes"])
    cells, _ = decide.decision_map(base, P["contexts"], P["hit_rates"], [price_factor], opts, reuse, floor)
    return cells, P


def figure(price_factor: float = 1.0):
    """The decision map (one panel) as a matplotlib figure."""
    cells, P = default_map(price_factor)
    fig = figures.decision_map(cells, P["layouts"])
    # chapter 5's legend runs along the top of three panels; for one panel it goes below, in two columns
    for leg in list(fig.legends):
        handles, labels = leg.legend_handles, [t.get_text() for t in leg.get_texts()]
        title = leg.get_title().get_text()
        leg.remove()
        fig.legend(handles, labels, title=title, ncol=2, fontsize=8, title_fontsize=8, frameon=False,
                   loc="upper center", bbox_to_anchor=(0.5, 0.0))
    return fig
