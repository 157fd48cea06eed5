"""The book's headline figure for the front page: chapter 5's decision map at chapter 5's default
parameters, one panel (the SSD prices of ``data/hardware.csv``) so that it is legible at page width.

The front page cannot show chapter 5's figure itself (glue from another page renders text only), so it
re-draws it with the same code and defaults; chapter 4's fidelity runs are read from the on-disk
result cache that chapter 5 shares, so the cost is the map itself (seconds).
"""
from __future__ import annotations

from .. import plots
from . import configure as compose_configure
from . import decide, fidelity, figures
from .params import SCHEMA

CHAPTER = "05_where_kv_lives"


def default_map(price_factor: float = 1.0):
    """(cells, parameters) of chapter 5's decision map at its defaults, at one SSD price factor, built
    as the chapter builds it: chapter 2's routing-dependent reuse curve, chapter 4's measured policies
    with the fidelity of the declared source, the declared floor, every deployment mode of the chapter."""
    P = SCHEMA.validate(SCHEMA.defaults())
    cfg = SCHEMA.config(P)
    base = compose_configure.base_scenario(cfg)
    reuse = compose_configure.reuse(cfg)
    measured = compose_configure.kv_policies(cfg, source="chapter 4")
    policies = fidelity.with_source(measured, P["fidelity_source"], model=P["model"])
    floor = compose_configure.fidelity_floor(cfg, policies)
    opts = decide.options(P["layouts"], policies, P["modes"])
    cells, _ = decide.decision_map(base, P["contexts"], P["hit_rates"], [price_factor], opts, reuse, floor)
    return cells, P


def figure(price_factor: float = 1.0):
    """The decision map (one panel, sized as chapter 5's opening map) as a matplotlib figure."""
    cells, P = default_map(price_factor)
    fig = figures.decision_map(cells, P["layouts"], factors=[price_factor], panel_width=5.4,
                               fontsize=plots.SMALL_PT)
    # chapter 5's legend runs along the top of the panels; for the front page it goes below, in two columns
    for leg in list(fig.legends):
        handles, labels = leg.legend_handles, [t.get_text() for t in leg.get_texts()]
        title = leg.get_title().get_text()
        leg.remove()
        fig.legend(handles, labels, title=title, ncol=2, fontsize=plots.SMALL_PT,
                   title_fontsize=plots.SMALL_PT, frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, 0.0))
    return fig
