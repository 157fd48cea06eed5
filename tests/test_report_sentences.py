"""Prose that cannot contradict its numbers (issue 30, item 7): sentences stating a comparison or an
outcome are written from the values (analysis.report.compare_text / target_text), and each chapter
states its run time from one source, the appendix's measurement (app_run_time_<chapter>)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from analysis import report
from analysis.compose.chapter import new_mode_text

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((REPO / "book").glob("0[1-9]_*.md"))


# ----------------------------------------------------------------------------------- compare_text
def test_compare_text_says_more_less_or_the_same_from_the_values():
    assert report.compare_text(1.65, 1.0) == "65% more than"
    assert report.compare_text(0.9, 1.0) == "10% less than"
    assert report.compare_text(1.0, 1.0) == "the same as"
    assert report.compare_text(1.004, 1.0) == "the same as"  # a difference that formats as 0% is none
    assert report.compare_text(3.0, 1.0, "{:.1f} s", relative=False, more="longer", less="shorter") \
        == "2.0 s longer than"
    assert report.compare_text(math.nan, 1.0).startswith("not comparable")


def test_compare_text_refuses_a_relative_comparison_with_zero():
    with pytest.raises(ValueError, match="relative=False"):
        report.compare_text(1.0, 0.0)


# ------------------------------------------------------------------------------------ target_text
def test_target_text_names_the_outcome_with_its_numbers():
    assert report.target_text("TPOT", 0.142, 0.15) == "meets the TPOT target (14.2% ≤ 15.0%)"
    assert report.target_text("TTFT", 0.35, 0.30) == "misses the TTFT target (35.0% > 30.0%)"
    assert report.target_text("score", 0.96, 0.95, lower_is_better=False).startswith("meets")
    assert report.target_text("score", 0.90, 0.95, lower_is_better=False) \
        == "misses the score target (90.0% < 95.0%)"
    assert "cannot be judged" in report.target_text("TTFT", math.nan, 0.3)


def test_target_text_names_the_groups_on_the_other_side():
    """Chapter 3's case: the pooled median meets the TTFT target while disaggregated runs miss it by far."""
    s = report.target_text("TTFT", 0.292, 0.30, group_noun="runs",
                           groups={"colocated": 0.25, "PD-disaggregated": 0.49, "other": math.nan})
    assert s == "meets the TTFT target overall (29.2% ≤ 30.0%) but misses it on PD-disaggregated runs (49.0%)"
    s = report.target_text("TTFT", 0.35, 0.30, groups={"colocated": 0.25, "PD": 0.49})
    assert s == "misses the TTFT target overall (35.0% > 30.0%) but meets it on colocated (25.0%)"
    # every group on the same side: nothing to qualify
    assert report.target_text("TPOT", 0.14, 0.15, groups={"a": 0.1, "b": 0.149}) \
        == "meets the TPOT target (14.0% ≤ 15.0%)"


# ---------------------------------------------------------------------------- chapter 5's sentence
def test_new_mode_sentence_is_written_from_the_values():
    s = new_mode_text(["C", "PD", "3-way", "PDAF"], 0.0, {"AF": 0.63})
    assert s == ("adding AF to the map over C, PD, 3-way, PDAF changes the cheapest option in 0% of the "
                 "cells; AF's best option costs a median 63% more than the cell's cheapest")
    assert "AF's best option costs a median the same as" in new_mode_text(["C"], 0.1, {"AF": 0.0})
    assert "never admissible" in new_mode_text(["C"], 0.1, {"AF": math.nan})
    assert "not computed" in new_mode_text([], math.nan, {"AF": 0.2})
    assert new_mode_text(["C"], 0.0, {}) == "no newly entered deployment mode is priced"


# ------------------------------------------------------------------- what the chapters' prose says
def _prose(path: Path) -> str:
    """A chapter's Markdown without its code cells and front matter."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^---\n.*?\n---\n", "", text, count=1, flags=re.S)
    return re.sub(r"```\{code-cell\}.*?```", "", text, flags=re.S)


def _sentences(prose: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n|\n(?=#)", prose):  # paragraphs (a heading ends one), then sentences
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z*])", re.sub(r"\s+", " ", para).strip())
    return out


RUN_TIME = re.compile(r"\b(run time|ran in|run took|computations took|took)\b", re.I)
WHOLE = re.compile(r"\b(chapter|page)(?:'s)?\b", re.I)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_states_its_run_time_from_the_appendix_only(path):
    """Every sentence about the chapter's (or page's) run time glues the appendix's one measurement of this
    chapter; a second, in-page timer (chapter 4: 193 s in its box, 139 s in Limits) is what this forbids."""
    own = f"appendix_reproduce.md::app_run_time_{path.stem}"
    prose = _prose(path)
    assert own in prose, f"{path.name} does not state its run time from {own}"
    bad = [s for s in _sentences(prose) if RUN_TIME.search(s) and WHOLE.search(s) and own not in s
           and "{glue" in s]
    assert not bad, f"{path.name}: run-time sentences not glued from {own}: {bad}"
    other = re.findall(r"app_run_time_(\w+)", prose)
    assert set(other) == {path.stem}, f"{path.name} states another chapter's run time: {other}"


def test_chapter_3_states_the_validation_targets_from_the_values():
    prose = _prose(REPO / "book" / "03_disagg.md")
    for m in ("ttft", "tpot"):
        assert f"{{glue:text}}`ch3_val_{m}_target_text`" in prose
    # the bare verbs ('meets' / 'misses' without the numbers or the modes) are no longer shown
    assert "`ch3_val_ttft_target`" not in prose and "`ch3_val_tpot_target`" not in prose


def test_chapter_5_states_the_new_modes_from_the_values():
    prose = _prose(REPO / "book" / "05_where_kv_lives.md")
    assert "{glue:text}`ch5_new_mode_text`" in prose
    assert "`ch5_new_mode_premium` more" not in prose  # "a median AF 63% more": a label where a number goes
