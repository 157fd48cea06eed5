"""The interactive decision map of chapter 5 (:func:`analysis.compose.figures.interactive_map_html`) in a
real browser: moving the SSD-price control changes the map, moving prompt length and reuse changes the
cell shown, and the page logs no error and requests nothing from the network (the Plotly bundle is
inline in the synthetic page; the chapter page loads the book's one copy, _static/plotly.min.js).
Once on a small synthetic grid (always), once on the built chapter page (when ``_build/html``
exists). A missing Chromium fails, as in tests/test_browser.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.compose import figures
from tests import browser_helpers as bh

LAYOUTS = ["hbm", "dram", "nvme"]


def _grid():
    """Two SSD prices whose maps differ, 2 prompt lengths x 3 reuse levels."""
    cells, every = [], []
    for f in (0.5, 4.0):
        for c in (4096, 16384):
            for h in (0.0, 0.4, 0.8):
                lay = "hbm" if h == 0 else ("nvme" if f < 1 else "dram")
                cost = 1.0 + c / 1e5 - h * (0.3 if lay == "nvme" else 0.1)
                cells.append({"ssd_price_factor": f, "context": c, "hit_rate": h, "layout": lay,
                              "policy": "full cache", "mode": "C", "usd_per_mtok": cost, "flips": h == 0.4})
                for lay2, extra in (("hbm", 0.2), ("dram", 0.1), ("nvme", 0.05)):
                    every.append({"ssd_price_factor": f, "context": c, "hit_rate": h, "layout": lay2,
                                  "admissible": True, "usd_per_mtok": cost + (0 if lay2 == lay else extra)})
    return pd.DataFrame(cells), pd.DataFrame(every)


def test_interactive_data_is_the_grid():
    cells, every = _grid()
    d = figures.interactive_data(cells, every, LAYOUTS)
    assert d["factors"] == [0.5, 4.0] and d["contexts"] == [4096, 16384] and d["hits"] == [0.0, 0.4, 0.8]
    assert d["maps"][0]["z"][0] == [0, 2, 2] and d["maps"][1]["z"][0] == [0, 1, 1]
    assert d["maps"][0]["flips"][1] == [False, True, False]
    # the bars are the cheapest admissible cost of each layout, the cell's answer the lowest
    b = d["bars"][1][1][2]
    assert np.argmin(b) == LAYOUTS.index("dram") and json.dumps(d)


def _move(drv, root, cls, value):
    drv.execute_script(
        "var r = document.getElementById(arguments[0]).querySelector('.' + arguments[1]);"
        "r.value = arguments[2]; r.dispatchEvent(new Event('input'));", root, cls, str(value))


def _z(drv, root):
    return drv.execute_script(
        "return JSON.stringify(document.getElementById(arguments[0] + '-map').data[0].z);", root)


def _shown(drv, root):
    """What the SSD price control can change: the map's layouts, its hover costs and the cost bars."""
    return drv.execute_script(
        "var m = document.getElementById(arguments[0] + '-map').data[0],"
        "    b = document.getElementById(arguments[0] + '-bars').data;"
        "return JSON.stringify([m.z, m.customdata, b.map(t => t.y)]);", root)


def _bars_title(drv, root):
    return drv.execute_script(
        "return document.getElementById(arguments[0] + '-bars').layout.title.text;", root)


def _check(drv, url, root):
    drv.get(url)
    drv.execute_async_script(
        "var done = arguments[arguments.length - 1], t0 = Date.now();"
        "(function wait() { var e = document.getElementById(arguments[0] + '-map');"
        "  if ((e && e.data) || Date.now() - t0 > 20000) done(); else setTimeout(wait, 100); })();", root)
    before = _z(drv, root)
    assert before, "the map did not render"
    # the cheapest layout may stay the same between two SSD prices (it does on the chapter's default
    # grid since the long-context fidelity sources entered); the costs shown must not
    _move(drv, root, "kv-f", 0)
    after = _shown(drv, root)
    _move(drv, root, "kv-f", drv.execute_script(
        "return document.getElementById(arguments[0]).querySelector('.kv-f').max;", root))
    assert _shown(drv, root) != after, "moving the SSD price control changed neither the map nor its costs"
    t0 = _bars_title(drv, root)
    _move(drv, root, "kv-c", 0)
    _move(drv, root, "kv-h", 0)
    assert _bars_title(drv, root) != t0, "moving prompt length / reuse did not change the cell shown"
    console, perf = bh.drain_logs(drv)
    assert not bh.console_errors(console), bh.console_errors(console)
    assert not bh.failed_requests(perf), bh.failed_requests(perf)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    drv = bh.start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield drv
    drv.quit()


def test_interactive_map_moves_in_the_browser(browser, tmp_path):
    cells, every = _grid()
    html = figures.interactive_map_html(figures.interactive_data(cells, every, LAYOUTS), "kvmap")
    head = "<meta charset='utf-8'><title>map</title><link rel='icon' href='data:,'>"
    page = f"<!doctype html><html><head>{head}</head><body>{html}</body></html>"
    (tmp_path / "index.html").write_text(page)
    bh.drain_logs(browser)
    with bh.serve(tmp_path) as url:
        _check(browser, url + "index.html", "kvmap")


def test_chapter_page_map_moves(browser):
    page = bh.SITE / "book" / "05_where_kv_lives.html"
    if not page.is_file():
        pytest.skip(f"{page} is absent: build the book first (python -m analysis.build)")
    bh.drain_logs(browser)
    with bh.serve(bh.SITE) as url:
        _check(browser, url + "book/05_where_kv_lives.html", "kv-decision-map")
