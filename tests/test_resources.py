"""The appendix's tables and glued values of measured chapter resources (analysis.resources)."""
import pandas as pd

from analysis import resources


def _rows():
    base = dict(status="ok", error="", date="2026-12-01", commit="abc", n_cpus=2, cpu_model="X",
                mem_total_bytes=2e10, python="3.11", load_avg_1min=1.0)
    return pd.DataFrame([
        {**base, "chapter": "01_a", "cache": "cold", "seconds": 20.0, "kernel_peak_rss_bytes": 1e9,
         "tree_peak_rss_bytes": 2e9},
        {**base, "chapter": "01_a", "cache": "warm", "seconds": 5.0, "kernel_peak_rss_bytes": 1e9,
         "tree_peak_rss_bytes": 0.5e9},
        {**base, "chapter": "02_b", "cache": "cold", "seconds": 100.0, "kernel_peak_rss_bytes": 3e9,
         "tree_peak_rss_bytes": 1e9, "load_avg_1min": 4.0},
        {**base, "chapter": "99_other", "cache": "cold", "seconds": 1e6, "kernel_peak_rss_bytes": 9e12,
         "tree_peak_rss_bytes": 0.0},
    ])


def test_toc_chapters_walks_parts_chapters_and_sections_in_order():
    toc = {"root": "book/intro", "parts": [
        {"chapters": [{"file": "book/01_a"}, {"file": "book/claims"},
                      {"file": "book/02_b", "sections": [{"file": "book/03_c.md"}]}]}],
        "chapters": [{"file": "book/04_d"}]}
    assert resources.toc_chapters(toc) == ["01_a", "02_b", "03_c", "04_d"]


def test_resource_table_says_what_is_not_measured_and_takes_the_larger_peak():
    t = resources.resource_table(_rows(), ["01_a", "02_b"])
    assert t.loc["01_a", "cold: time"] == "20 s" and t.loc["01_a", "warm: time"] == "5.0 s"
    assert t.loc["01_a", "cold: peak memory"] == resources.fmt_bytes(2e9)  # tree > kernel
    assert t.loc["02_b", "cold: time"] == "not measured yet"  # no warm row


def test_resource_glue_sums_only_the_chapters_of_the_toc():
    g = {name: value for name, value, _ in resources.resource_glue(_rows(), ["01_a", "02_b"])}
    assert g["app_res_total_cold"] == 120.0 and g["app_res_total_warm"] == 5.0
    assert g["app_res_n_measured"] == 2 and g["app_res_n_chapters"] == 2
    assert g["app_res_peak_mem"] == 3e9 and g["app_res_peak_mem_chapter"] == "02_b"
    assert g["app_res_load"] == 4.0 and "upper bounds" in g["app_res_load_note"]  # 4 > 2 cores + 0.5
    assert {"app_run_time_01_a", "app_run_time_02_b"} <= set(g)
