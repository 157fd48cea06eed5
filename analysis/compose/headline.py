"""The book's headline figure for the front page: chapter 5's decision map at chapter 5's default
parameters, one panel (the SSD prices of ``data/hardware.csv``) so that it is legible at page width.

The front page cannot show chapter 5's figure itself (glue from another page renders text only), so it
re-draws it with the same code and defaults; chapter 4's fidelity runs are read from the on-disk
result cache that chapter 5 shares, so the cost is the map itself (seconds).

It shows only what the book measured or marks what it borrowed (issue 30): :func:`borrowed` lists the
evidence the map's answers use that comes from published scores rather than this book's measurement
(with the book's own measurement against the floor), :func:`borrowed_text` says it in a sentence for the
front page and :func:`figure` marks a borrowed KV policy in every cell it appears in.
"""
from __future__ import annotations

import pandas as pd

from .. import plots
from . import configure as compose_configure
from . import decide, fidelity, figures
from .params import SCHEMA

CHAPTER = "05_where_kv_lives"


def default_map_parts(price_factor: float = 1.0) -> dict:
    """Chapter 5's decision map at its defaults, at one SSD price factor, built as the chapter builds it:
    chapter 2's routing-dependent reuse curve, chapter 4's measured policies with the fidelity of the
    declared source, the declared floor, every deployment mode of the chapter. Returns ``cells``, the
    parameters ``P``, chapter 4's ``measured`` policies, the ``policies`` the map judged (the declared
    source's fidelity), the ``floor`` and the AI SSD's stored ``ai_ssd_bits``."""
    P = SCHEMA.validate(SCHEMA.defaults())
    cfg = SCHEMA.config(P)
    base = compose_configure.base_scenario(cfg)
    reuse = compose_configure.reuse(cfg)
    measured = compose_configure.kv_policies(cfg, source="chapter 4")
    policies = fidelity.with_source(measured, P["fidelity_source"], model=P["model"])
    floor = compose_configure.fidelity_floor(cfg, policies)
    opts = decide.options(P["layouts"], policies, P["modes"])
    cells, _ = decide.decision_map(base, P["contexts"], P["hit_rates"], [price_factor], opts, reuse, floor)
    return {"cells": cells, "P": P, "measured": measured, "policies": policies, "floor": floor,
            "ai_ssd_bits": int(base.tiers.ai_ssd_bits)}


def default_map(price_factor: float = 1.0):
    """(cells, parameters) of chapter 5's decision map at its defaults (:func:`default_map_parts`)."""
    parts = default_map_parts(price_factor)
    return parts["cells"], parts["P"]


# ------------------------------------------------------------------------- borrowed evidence
BORROWED_MARK = "*"  # after a cell's policy on the front page: admitted on published scores, not measured


def borrowed(parts: dict) -> pd.DataFrame:
    """What the map's answers rest on that this book did not measure: one row per piece of evidence the
    chosen cells use (each KV policy chosen, and on AI SSD cells the drive's in-drive quantization), with
    the share of cells, whether its fidelity is ``borrowed`` (published benchmark scores) and, for a
    borrowed one, this book's own measurement (chapter 4: top-1 agreement, perplexity change) and
    whether the declared floor admits it on that measurement (``own_admits``)."""
    cells, floor = parts["cells"], parts["floor"]
    chosen = cells[cells["policy"].notna()]
    n = max(len(cells), 1)
    by_label = {p.label: p for p in parts["policies"]}
    own_by_label = {p.label: p for p in parts["measured"]}
    rows = []
    for label, k in chosen["policy"].value_counts().items():
        p = by_label[label]
        rows.append(_evidence_row(label, "KV policy", k / n, p, own_by_label.get(label), floor))
    on_drive = chosen[chosen["layout"] == "ai_ssd"]
    if len(on_drive):
        bits = parts["ai_ssd_bits"]
        p = floor.in_drive_policy(bits)
        own = fidelity.in_drive_policy(bits, parts["measured"], source="chapter 4")
        rows.append(_evidence_row(f"AI SSD in-drive {bits}-bit quantization", "in-drive quantization",
                                  len(on_drive) / n, p, own, floor))
    return pd.DataFrame(rows, columns=["evidence", "kind", "share", "source", "borrowed", "published_ratio",
                                       "own_top1", "own_ppl_change", "own_admits", "evidence_text"])


def _evidence_row(label, kind, share, p, own, floor) -> dict:
    has_own = own is not None and own.source == "chapter 4"
    return {"evidence": label, "kind": kind, "share": float(share), "source": p.source,
            "borrowed": p.source == "published", "published_ratio": float(p.score_ratio),
            "own_top1": float(own.top1) if has_own else float("nan"),
            "own_ppl_change": float(own.ppl_change) if has_own else float("nan"),
            "own_admits": bool(floor.admits(own)) if has_own else None, "evidence_text": p.evidence}


def borrowed_text(table: pd.DataFrame, floor) -> str:
    """The front page's sentence on borrowed evidence, from :func:`borrowed`'s rows: each borrowed piece
    with its share of the cells and this book's own measurement against the floor."""
    out = []
    for r in table.itertuples():
        if not r.borrowed:
            continue
        s = (f"{r.evidence} (the {r.kind} of {r.share:.0%} of the cells) is admitted on published scores "
             f"({r.published_ratio:.0%} of the full cache's: {r.evidence_text})")
        if r.own_admits is None:
            s += ", which this book did not measure"
        else:
            verdict = "passes" if r.own_admits else "fails"
            s += (f"; this book's own measurement (chapter 4) gives {r.own_ppl_change:+.1%} perplexity and "
                  f"{r.own_top1:.0%} top-1 agreement, which {verdict} the floor (at most "
                  f"{floor.max_ppl_change:.0%} more perplexity, at least {floor.top1:.0%} top-1 agreement)")
        out.append(s)
    if not out:
        return "every piece of evidence the map's answers use was measured by this book"
    return "; ".join(out)


def borrowed_summary(table: pd.DataFrame) -> str:
    """The short form of :func:`borrowed_text` for the front page's answer: what is borrowed, on how much
    of the map, and whether this book's own measurement passes the floor."""
    b = table[table["borrowed"]]
    if b.empty:
        return "nothing: every piece of evidence the map uses was measured by this book"
    what = " and ".join(f"{r.evidence} ({r.share:.0%} of the cells)" for r in b.itertuples())
    own = b["own_admits"]
    if own.isna().all():
        tail = "this book did not measure " + ("it" if len(b) == 1 else "them")
    elif (own == False).all():  # noqa: E712 (object column: True / False / None)
        tail = "this book's own measurement of " + ("it" if len(b) == 1 else "them") + " fails the floor"
    elif (own == True).all():  # noqa: E712
        tail = "this book's own measurement of " + ("it" if len(b) == 1 else "them") + " passes the floor"
    else:
        tail = ("this book's own measurement passes the floor for "
                + ", ".join(b.loc[own == True, "evidence"]) + " only")  # noqa: E712
    return f"{what} {'is' if len(b) == 1 else 'are'} admitted on published scores; {tail}"


def mark_borrowed(cells: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with :data:`BORROWED_MARK` after each borrowed KV policy's label (what the figure writes)."""
    marked = set(table.loc[table["borrowed"] & (table["kind"] == "KV policy"), "evidence"])
    out = cells.copy()
    out["policy"] = [f"{p}{BORROWED_MARK}" if p in marked else p for p in out["policy"]]
    return out


def figure(price_factor: float = 1.0, parts: dict | None = None):
    """The decision map (one panel, sized as chapter 5's opening map) as a matplotlib figure; a KV policy
    admitted on published scores (borrowed, :func:`borrowed`) is marked with :data:`BORROWED_MARK` in its
    cells, and so is the AI SSD layout in the legend when its in-drive quantization is borrowed.
    ``parts``: :func:`default_map_parts` already computed (the front page glues from the same map)."""
    parts = default_map_parts(price_factor) if parts is None else parts
    table = borrowed(parts)
    cells = mark_borrowed(parts["cells"], table)
    drive_borrowed = bool((table["borrowed"] & (table["kind"] == "in-drive quantization")).any())
    P = parts["P"]
    fig = figures.decision_map(cells, P["layouts"], factors=[price_factor], panel_width=5.4,
                               fontsize=plots.SMALL_PT)
    # chapter 5's legend runs along the top of the panels; for the front page it goes below, in two columns
    for leg in list(fig.legends):
        handles, labels = leg.legend_handles, [t.get_text() for t in leg.get_texts()]
        labels = [f"{x}{BORROWED_MARK}" if drive_borrowed and x == decide.LAYOUT_LABELS["ai_ssd"] else x
                  for x in labels]
        title = leg.get_title().get_text()
        leg.remove()
        fig.legend(handles, labels, title=title, ncol=2, fontsize=plots.SMALL_PT,
                   title_fontsize=plots.SMALL_PT, frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, 0.0))
    return fig
