"""Measured run times of the chapters (``data/chapter_resources.csv``, written by
``benchmarks/chapter_resources.py``), for the appendix, which glues each chapter's line for that
chapter's opening box. Kept out of :mod:`analysis.report` so that rerunning the benchmark changes the
execution-cache key of the appendix only, not of every chapter (analysis.deps follows imports)."""
from __future__ import annotations

import re

import pandas as pd

from . import data
from .report import fmt_bytes


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


def toc_chapters(toc: dict) -> list[str]:
    """Stems of the numbered chapters (``book/NN_slug``) of a Jupyter Book table of contents, in order."""
    out = []

    def walk(items):
        for it in items or []:
            m = re.match(r"^book/(\d\d_[^/.]+)", str(it.get("file", "")))
            if m:
                out.append(m.group(1))
            walk(it.get("sections"))
            walk(it.get("chapters"))

    for part in toc.get("parts", []) or []:
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return out


def _secs(s: float) -> str:
    return f"{s:,.0f} s" if s >= 10 else f"{s:.1f} s"


def _with_peak(res: pd.DataFrame) -> pd.DataFrame:
    res = res.copy()
    res["peak_rss_bytes"] = res[["kernel_peak_rss_bytes", "tree_peak_rss_bytes"]].max(axis=1)
    return res


def resource_table(res: pd.DataFrame, chapters: list[str]) -> pd.DataFrame:
    """One row per chapter: cold and warm time and peak memory, and when it was measured."""
    res = _with_peak(res)
    rows = []
    for ch in chapters:
        r = res[res["chapter"] == ch].set_index("cache")
        if not {"cold", "warm"} <= set(r.index):
            rows.append({"chapter": ch, "cold: time": "not measured yet", "cold: peak memory": "",
                         "warm: time": "", "warm: peak memory": "", "measured": ""})
            continue
        c, w = r.loc["cold"], r.loc["warm"]
        ok = (c["status"] == "ok") and (w["status"] == "ok")
        rows.append({"chapter": ch, "cold: time": _secs(c["seconds"]) if ok else f"failed: {c['error']}",
                     "cold: peak memory": fmt_bytes(c["peak_rss_bytes"]),
                     "warm: time": _secs(w["seconds"]) if ok else "",
                     "warm: peak memory": fmt_bytes(w["peak_rss_bytes"]),
                     "measured": f"{c['date']}, commit {c['commit']}"})
    return pd.DataFrame(rows).set_index("chapter")


def resource_glue(res: pd.DataFrame, chapters: list[str]) -> list[tuple]:
    """The appendix's glued values as ``(name, value, fmt)`` rows, each chapter's run-time line
    included (its opening box glues it across pages)."""
    res = _with_peak(res)
    measured = res[res["chapter"].isin(chapters)]
    cold = measured[measured["cache"] == "cold"]
    dates = sorted(measured["date"].astype(str).unique())
    load, cores = float(measured["load_avg_1min"].max()), int(measured["n_cpus"].min())
    machine = "; ".join(sorted({f"{int(r.n_cpus)} cores of {r.cpu_model}, {fmt_bytes(r.mem_total_bytes)} "
                                f"of memory, Python {r.python}" for r in measured.itertuples()}))
    rows = [("app_res_n_measured", int(cold["chapter"].nunique()), None)]
    rows += [(f"app_run_time_{ch}", run_time_text(ch), None) for ch in chapters]
    rows += [
        ("app_res_n_chapters", len(chapters), None),
        ("app_res_dates", dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}", None),
        ("app_res_machine", machine, None),
        ("app_res_total_cold", cold["seconds"].sum(), "{:,.0f} s"),
        ("app_res_total_warm", measured[measured["cache"] == "warm"]["seconds"].sum(), "{:,.0f} s"),
        ("app_res_peak_mem", measured["peak_rss_bytes"].max(), "bytes"),
        ("app_res_peak_mem_chapter", measured.loc[measured["peak_rss_bytes"].idxmax(), "chapter"], None),
        ("app_res_load", load, "{:.1f}"),
        ("app_res_load_note", "other work shared the cores while they ran, so the times are upper bounds"
         if load > cores + 0.5 else "the machine was otherwise idle", None),
    ]
    return rows


def registry_table() -> pd.DataFrame:
    """The external files of ``data/registry.yaml``: file, licence, source, sha256, canonical URL."""
    rows = [{"name": name, "file": e["mirror"], "licence": e["licence"], "source": e["source"],
             "sha256": e["sha256"], "canonical URL": e["url"]} for name, e in data.registry().items()]
    return pd.DataFrame(rows).set_index("name")


def inputs_table(files=("models.csv", "hardware.csv", "published.csv")) -> pd.DataFrame:
    """Per in-repo table: rows, rows marked estimate, distinct sources, newest date."""
    rows = []
    for f in files:
        t = data.table(f)
        est = int(t["estimate"].fillna(0).astype(int).sum()) if "estimate" in t else 0
        rows.append({"table": f"data/{f}", "rows": len(t), "rows marked estimate": est,
                     "distinct sources": t["source"].nunique(), "newest date": t["date"].astype(str).max()})
    return pd.DataFrame(rows).set_index("table")
