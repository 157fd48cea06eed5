"""Measured run times of the chapters (``data/chapter_resources.csv``, written by
``benchmarks/chapter_resources.py``), for the appendix, which glues each chapter's line for that
chapter's opening box. Kept out of :mod:`analysis.report` so that rerunning the benchmark changes the
execution-cache key of the appendix only, not of every chapter (analysis.deps follows imports)."""
from __future__ import annotations

from . import data


def run_time_text(chapter: str) -> str:
    """Measured run time of a chapter from ``data/chapter_resources.csv`` (cold and warm cache), with
    the machine's load, for the chapter's opening box; says so when it has not been measured."""
    df = data.table("chapter_resources.csv")
    rows = df[(df["chapter"] == chapter) & (df["status"] == "ok")]
    if rows.empty:
        return "not measured yet (benchmarks/chapter_resources.py)"
    parts = [f"{float(r.seconds):.0f} s {r.cache}" for r in rows.itertuples()]
    r = rows.iloc[0]
    return (f"{', '.join(parts)} with default parameters (measured {r['date']} on {int(r['n_cpus'])} cores, "
            f"load {float(r['load_avg_1min']):.1f})")
