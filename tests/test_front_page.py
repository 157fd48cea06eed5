"""The front page (issue 30, item 4): its map shows only what the book measured or marks what it borrowed,
and its answers carry verdict badges (book/intro.md, analysis.compose.headline)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.compose import headline
from analysis.compose.decide import FidelityFloor
from analysis.compose.fidelity import KVPolicy

INTRO = Path(__file__).resolve().parent.parent / "book" / "intro.md"


def _parts(snap_source="published", kivi_top1=0.92, kivi_ppl=0.75, layouts=("ai_ssd", "hbm")):
    own_snap = KVPolicy("snapkv", 0.25, top1=0.90, ppl_change=0.251)
    kivi = KVPolicy("kivi4", 0.25, top1=kivi_top1, ppl_change=kivi_ppl)
    snap = own_snap if snap_source == "chapter 4" else KVPolicy(
        "snapkv", 0.25, top1=0.90, ppl_change=0.251, source="published", score_ratio=0.95,
        score_ratio_min=0.93, evidence="longbench on Llama-3-70B")
    drive = KVPolicy("ai_ssd_int4", 0.25, source="published", score_ratio=1.0, score_ratio_min=1.0,
                     evidence="longbench8 on Llama-2-13B")
    floor = FidelityFloor(0.9, 0.05, 0.95, in_drive={4: drive})
    n = len(layouts)
    cells = pd.DataFrame({"policy": ["snapkv @ 25%"] * n + [None], "layout": list(layouts) + [None],
                          "mode": ["C"] * n + [None]})
    return {"cells": cells, "measured": [own_snap, kivi], "policies": [snap, kivi], "floor": floor,
            "ai_ssd_bits": 4}


def test_borrowed_lists_published_evidence_with_the_books_own_measurement():
    t = headline.borrowed(_parts())
    snap = t[t["kind"] == "KV policy"].iloc[0]
    assert snap["evidence"] == "snapkv @ 25%" and bool(snap["borrowed"])
    assert snap["share"] == pytest.approx(2 / 3)  # of every cell, the one with no admissible option included
    assert snap["own_ppl_change"] == pytest.approx(0.251)
    assert snap["own_admits"] is not None and not snap["own_admits"]
    drive = t[t["kind"] == "in-drive quantization"].iloc[0]
    assert bool(drive["borrowed"]) and drive["share"] == pytest.approx(1 / 3)
    assert drive["own_ppl_change"] == pytest.approx(0.75)
    assert drive["own_admits"] is not None and not drive["own_admits"]


def test_borrowed_text_says_what_the_book_measured_against_the_floor():
    parts = _parts()
    s = headline.borrowed_text(headline.borrowed(parts), parts["floor"])
    assert "snapkv @ 25% (the KV policy of 67% of the cells) is admitted on published scores (95%" in s
    assert "gives +25.1% perplexity and 90% top-1 agreement, which fails the floor (at most 5% more" in s
    assert "AI SSD in-drive 4-bit quantization" in s and "+75.0% perplexity" in s
    ok = _parts(kivi_ppl=0.01)
    assert "+1.0% perplexity and 92% top-1 agreement, which passes the floor" in \
        headline.borrowed_text(headline.borrowed(ok), ok["floor"])


def test_borrowed_summary_is_the_short_form():
    parts = _parts()
    t = headline.borrowed(parts)
    assert headline.borrowed_summary(t) == (
        "snapkv @ 25% (67% of the cells) and AI SSD in-drive 4-bit quantization (33% of the cells) are "
        "admitted on published scores; this book's own measurement of them fails the floor")
    ok = headline.borrowed(_parts(kivi_ppl=0.01))
    assert headline.borrowed_summary(ok).endswith(
        "passes the floor for AI SSD in-drive 4-bit quantization only")
    assert headline.borrowed_summary(t[~t["borrowed"]]).startswith("nothing")


def test_measured_evidence_is_not_called_borrowed():
    parts = _parts(snap_source="chapter 4", layouts=("hbm", "dram"))
    t = headline.borrowed(parts)
    assert list(t["borrowed"]) == [False] and math.isnan(t["published_ratio"].iloc[0])
    assert headline.borrowed_text(t, parts["floor"]).startswith("every piece of evidence")
    assert list(headline.mark_borrowed(parts["cells"], t)["policy"][:2]) == ["snapkv @ 25%"] * 2


def test_the_map_marks_a_borrowed_policy_in_its_cells():
    parts = _parts()
    marked = headline.mark_borrowed(parts["cells"], headline.borrowed(parts))
    assert list(marked["policy"][:2]) == [f"snapkv @ 25%{headline.BORROWED_MARK}"] * 2
    assert pd.isna(marked["policy"].iloc[2])  # a cell with no admissible option keeps its empty policy
    assert list(parts["cells"]["policy"][:2]) == ["snapkv @ 25%"] * 2  # the map's own cells are untouched


# ------------------------------------------------------------------------------ the page's source
def _answers_table(text: str) -> str:
    i = text.find(":class: kvbook-answers\n")
    assert i >= 0 and text.rfind("```{list-table}", 0, i) >= 0, \
        "book/intro.md has no list-table with :class: kvbook-answers"
    return text[i:text.index("\n```", i)]


def test_every_answer_has_a_verdict_from_its_chapter():
    table = _answers_table(INTRO.read_text())
    rows = re.split(r"^\* - ", table, flags=re.M)[2:]  # the header row first
    assert len(rows) >= 8
    for row in rows:
        cells = re.split(r"^  - ", row, flags=re.M)
        assert len(cells) == 3, row[:80]
        verdicts = re.findall(r"\{glue:text\}`(\d\d_\w+)\.md::(\w+):s`", cells[2])
        assert verdicts, f"an answer without a glued verdict: {cells[0][:60]}"
        assert all("verdict" in key for _, key in verdicts), verdicts


def test_answer_4_states_its_weakest_point_and_the_map_its_borrowed_evidence():
    text = INTRO.read_text()
    rows = re.split(r"^\* - ", _answers_table(text), flags=re.M)
    row = next(r for r in rows if "Tiering in the replay" in r)
    assert "02_ssd_offload.md::ch2_ssd_vs_mem" in row and "02_ssd_offload.md::ch2_verdict_tiering" in row
    assert 'glue("intro_map_borrowed", headline.borrowed_text(' in text
    assert "{glue:text}`intro_map_borrowed_short`" in next(r for r in rows if "Where the KV cache lives" in r)
    assert "{glue:text}`intro_map_borrowed`" in text.split("name: fig-headline")[1]  # under the map
    assert "headline.figure(parts=headline_map)" in text  # the figure and the sentence from one map
