"""Every chapter is thin and follow the book's figure convention: no function or lambda is
defined in a chapter, every cell that shows a figure carries a name and a caption (myst-nb figure
metadata), and the name ``fig-a-b`` is the function ``fig_a_b`` of the chapter's ``figures`` module."""
import importlib
import re
from pathlib import Path

import pytest
import yaml

BOOK = Path(__file__).resolve().parent.parent / "book"
CHAPTERS = {"01_kv_footprint.md": "analysis.kv_figures", "02_ssd_offload.md": "analysis.tiering.figures",
            "02_ssd_offload_evidence.md": "analysis.tiering.figures",
            "03_disagg.md": "analysis.disagg.figures",
            "03_disagg_evidence.md": "analysis.disagg.figures", "04_qevict.md": "analysis.qevict.figures",
            "04_qevict_evidence.md": "analysis.qevict.figures",
            "05_where_kv_lives.md": "analysis.compose.figures",
            "05_where_kv_lives_evidence.md": "analysis.compose.figures"}
# numbers a caption may state because the figure function draws them as constants (not results)
DRAWING_CONSTANTS = {"fig-disagg-validation": {"30%"}}  # the shaded +-30% band (xs / 1.3 .. xs * 1.3)
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.S | re.M)


def cells(text):
    """(metadata, source) of each code cell of a MyST notebook."""
    out = []
    for body in CELL.findall(text):
        meta = {}
        if body.startswith("---\n"):
            head, body = body[4:].split("\n---\n", 1)
            meta = yaml.safe_load(head)
        out.append((meta, body))
    return out


@pytest.mark.parametrize("page", sorted(p.name for p in BOOK.glob("*.md")))
def test_no_function_or_lambda_in_any_page(page):
    src = "\n".join(b for _, b in cells((BOOK / page).read_text()))
    assert not re.search(r"^\s*def |lambda[\s:]", src, re.M)


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_figure_has_a_name_a_caption_and_its_function(chapter):
    module = importlib.import_module(CHAPTERS[chapter])
    shown = [(m, b) for m, b in cells((BOOK / chapter).read_text()) if "plt.show()" in b]
    assert shown
    for meta, body in shown:
        fig = (meta.get("mystnb") or {}).get("figure") or {}
        assert fig.get("name", "").startswith("fig-") and len(fig.get("caption", "")) > 40, body[:200]
        func = fig["name"].replace("-", "_")
        assert callable(getattr(module, func, None)), func
        assert f"{func}(" in body, f"{fig['name']} is not drawn by {func}"
        typed = re.findall(r"\d+\.\d+|\d+%", fig["caption"])
        allowed = {"95%"} | DRAWING_CONSTANTS.get(fig["name"], set())
        assert set(typed) <= allowed, f"numbers in a caption must be glued: {typed}"
