"""One seaborn theme and the figure helpers every chapter uses.

``setup()`` applies the theme (readable in print, colour-blind-safe palette: seaborn's
``colorblind``, with markers/line styles as a second cue). ``PALETTE`` is the one palette of the book;
``FAMILY_COLORS`` fixes a colour per attention family across chapters.

The book's figure rules (issue 30), each with its helper here and checked for every chapter's figures by
``tests/test_figures_style.py``:

* **no text under ``MIN_TEXT_PX`` (10 px) as displayed** in the book's content column at a 1280 px
  window (:func:`displayed_px`, the rule; :func:`min_font_pt` and :func:`max_width_in`, its inverses;
  ``SMALL_PT``, the smallest font a figure uses, legible up to ``BOOK_WIDTH_IN``);
* **at most ``MAX_SERIES`` (6) labelled series per panel**: :func:`chunks` splits more into small
  multiples, :func:`context_lines` draws the other panels' series in light grey behind the focus;
* **every series distinct in colour and in marker and line style** (:func:`series_style`, from the
  six colour-blind-safe ``SERIES_COLORS``);
* **legends off the data**: :func:`legend_below` / :func:`legend_right` (outside the axes, room made by
  the constrained layout of :func:`subplots`).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import seaborn as sns

from .report import fmt_bytes

PALETTE = sns.color_palette("colorblind")
SEQUENTIAL = "viridis"  # perceptually uniform, colour-blind safe, prints in greyscale
DIVERGING = "vlag"
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
LINESTYLES = ["-", "--", ":", "-."]  # second cue after colour when there are more series than colours
FAMILY_COLORS = {
    "MHA": PALETTE[0], "GQA": PALETTE[1], "MLA": PALETTE[2], "Sliding/global": PALETTE[3],
    "Hybrid linear": PALETTE[4], "MQA": PALETTE[5],
}

# ---------------------------------------------------------------------------------- legibility rule
# The widest a figure's image is shown in the book at a 1280 x 900 window (sphinx-book-theme: 20%
# primary sidebar, the secondary sidebar's width off the article, 2 rem padding each side): measured in
# headless Chromium on the built book, article.bd-article 752 px wide, its <figure> 688 px, and every
# figure image wider than the column shown 672 px wide (``img.getBoundingClientRect().width``).
BOOK_CONTENT_PX = 672
FIG_DPI = 110  # the inline backend saves each figure at ``figure.dpi`` (set by :func:`setup`)
SAVE_PAD_IN = 0.1  # ``bbox_inches="tight"`` adds this on every side
MIN_TEXT_PX = 10
MAX_SERIES = 6
SMALL_PT = 9.0  # the smallest font any figure uses (annotations, cell text, legends)
BOOK_WIDTH_IN = 7.5  # the default width of a figure; SMALL_PT stays >= MIN_TEXT_PX up to max_width_in()
GREY = "0.78"  # context series (not the panel's focus): light grey, thin, no marker, no label


def displayed_px(size_pt: float, width_in: float, dpi: float = FIG_DPI,
                 column_px: float = BOOK_CONTENT_PX) -> float:
    """Height in CSS px of text of ``size_pt`` points as the book shows it: the figure's PNG is
    ``width_in * dpi`` px wide (``width_in``: the saved, tight width) and the page scales it down to the
    content column when wider (``max-width: 100%``), never up. So

        px = size_pt * dpi / 72 * min(1, column_px / (width_in * dpi))

    i.e. ``size_pt * dpi / 72`` for a figure narrower than the column and ``size_pt * column_px /
    (72 * width_in)`` (independent of the dpi) for a wider one."""
    natural = width_in * dpi
    return size_pt * dpi / 72.0 * min(1.0, column_px / natural)


def min_font_pt(width_in: float, dpi: float = FIG_DPI, column_px: float = BOOK_CONTENT_PX,
                min_px: float = MIN_TEXT_PX) -> float:
    """The smallest font (pt) that :func:`displayed_px` shows at ``min_px`` or more in a figure saved
    ``width_in`` inches wide."""
    return min_px / displayed_px(1.0, width_in, dpi, column_px)


def max_width_in(size_pt: float = SMALL_PT, dpi: float = FIG_DPI, column_px: float = BOOK_CONTENT_PX,
                 min_px: float = MIN_TEXT_PX) -> float:
    """The widest saved figure (inches) in which ``size_pt`` text still shows at ``min_px`` or more
    (0 when even an unscaled figure shows it smaller)."""
    if size_pt * dpi / 72.0 < min_px:
        return 0.0
    return size_pt * column_px / (72.0 * min_px)


def saved_width_in(fig) -> float:
    """The width (inches) of ``fig`` as the inline backend saves it (``bbox_inches='tight'``)."""
    bb = fig.get_tightbbox(fig.canvas.get_renderer())
    return bb.width + 2 * SAVE_PAD_IN


def figsize(height_in: float, width_in: float = BOOK_WIDTH_IN) -> tuple[float, float]:
    """A figure size no wider than the book's legible width for ``SMALL_PT`` text."""
    return (min(width_in, max_width_in(SMALL_PT) - 2 * SAVE_PAD_IN), height_in)


def subplots(nrows: int = 1, ncols: int = 1, height: float = 4.2, width: float = BOOK_WIDTH_IN, **kw):
    """``plt.subplots`` at a legible size (:func:`figsize`) with the constrained layout, which makes
    room for legends placed outside the axes (:func:`legend_below`, :func:`legend_right`)."""
    kw.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=figsize(height, width), **kw)


# ---------------------------------------------------------------------------------- series cues
# six hues of the colour-blind palette that stay apart for the common colour-vision deficiencies
# (blue, orange, green, vermillion, purple, brown); grey (7) is kept for context and references
SERIES_COLORS = [PALETTE[i] for i in (0, 1, 2, 3, 4, 5)]


def series_style(i: int, markevery=None, ms: float = 5, lw: float = 1.5) -> dict:
    """Line style of the ``i``-th series of a panel: colour, marker and line style each distinct for
    the first ``MAX_SERIES`` series (colour and marker change together; the line style is a third cue
    that also tells apart series ``MAX_SERIES`` apart)."""
    st = dict(color=SERIES_COLORS[i % len(SERIES_COLORS)], marker=MARKERS[i % len(MARKERS)],
              ls=LINESTYLES[i % len(LINESTYLES)], ms=ms, lw=lw)
    if markevery is not None:
        st["markevery"] = markevery
    return st


def chunks(items, size: int = MAX_SERIES) -> list[list]:
    """``items`` in consecutive groups of at most ``size``, as even as possible (13 -> 5, 4, 4): one
    panel each when a figure has more series than a panel may show."""
    items = list(items)
    if not items:
        return []
    n = -(-len(items) // size)
    base, extra = divmod(len(items), n)
    out, k = [], 0
    for j in range(n):
        m = base + (1 if j < extra else 0)
        out.append(items[k:k + m])
        k += m
    return out


def panel_grid(n: int, ncol: int = 2) -> tuple[int, int]:
    """(rows, columns) of a grid of ``n`` panels, at most ``ncol`` side by side."""
    c = max(1, min(n, ncol))
    return -(-n // c), c


def context_lines(ax, x, ys) -> None:
    """The series that are not this panel's focus, in thin light grey behind it, without labels."""
    for y in ys:
        ax.plot(x, y, color=GREY, lw=0.9, zorder=1, label="_nolegend_")


def place_labels(ax, x, y, texts, fontsize: float = SMALL_PT) -> list:
    """Annotate the points (x, y) with ``texts``, each at the first of eight offsets around its point
    where it overlaps no label placed before it (the last offset when none is free)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    offsets = [(4, 4, "left", "bottom"), (4, -4, "left", "top"), (-4, 4, "right", "bottom"),
               (-4, -4, "right", "top"), (0, 8, "center", "bottom"), (0, -8, "center", "top"),
               (8, 0, "left", "center"), (-8, 0, "right", "center")]
    placed, out = [], []
    for xi, yi, t in sorted(zip(x, y, texts), key=lambda r: (r[0], r[1])):
        for dx, dy, ha, va in offsets:
            a = ax.annotate(t, (xi, yi), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                            fontsize=fontsize)
            bb = a.get_window_extent(renderer)
            if not any(bb.overlaps(p) for p in placed):
                break
            a.remove()
        else:
            a = ax.annotate(t, (xi, yi), xytext=(4, 4), textcoords="offset points", fontsize=fontsize)
            bb = a.get_window_extent(renderer)
        placed.append(bb)
        out.append(a)
    return out


def tidy_log_ticks(fig) -> None:
    """On every log axis of ``fig`` still on matplotlib's default log labels: no minor-tick labels
    (they crowd and overlap when the range spans under a decade or two); over less than two decades,
    labels at 1, 2 and 5 times each power of ten instead, written plainly (``300``, ``0.2``)."""
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            if axis.get_scale() != "log" or not isinstance(axis.get_major_formatter(), mticker.LogFormatter):
                continue
            lo, hi = sorted(abs(v) for v in lim)
            if lo > 0 and np.log10(hi / lo) < 2:
                axis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(mticker.FuncFormatter(lambda x, _pos: f"{x:g}"))
            axis.set_minor_formatter(mticker.NullFormatter())


def label_right(ax, ys, names, fontsize: float = SMALL_PT, gap: float = 1.3) -> list:
    """Name horizontal reference lines (at data heights ``ys``) right of the axes, each label joined to
    its line by a thin leader and pushed apart by at least ``gap`` times its height (no two overlap).
    Call once the axes' limits and scales are final."""
    fig = ax.figure
    fig.canvas.draw()
    trans = ax.transData
    h = fontsize * fig.dpi / 72.0 * gap
    pts = sorted((trans.transform((0, y))[1], y, n) for y, n in zip(ys, names))
    placed = []
    for yd, _, _ in pts:
        placed.append(max(yd, placed[-1] + h) if placed else yd)
    over = placed[-1] - ax.bbox.y1 if placed else 0.0
    if over > 0:  # pushed above the axes: shift the stack down as far as the room below allows
        shift = min(over, max(0.0, placed[0] - ax.bbox.y0))
        placed = [p - shift for p in placed]
    out = []
    for (yd, y, name), p in zip(pts, placed):
        frac = (p - ax.bbox.y0) / ax.bbox.height
        out.append(ax.annotate(name, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(1.03, frac),
                               textcoords="axes fraction", va="center", ha="left", fontsize=fontsize,
                               annotation_clip=False,
                               arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=0)))
    return out


def legend_below(fig, handles=None, labels=None, ncol: int = 3, **kw):
    """A figure legend below the panels, off the data (the constrained layout makes its room)."""
    if handles is None:
        handles, labels = _collect(fig)
    kw.setdefault("fontsize", SMALL_PT)
    return fig.legend(handles, labels, loc="outside lower center", ncol=max(1, min(ncol, len(handles))),
                      frameon=False, **kw)


def legend_right(fig, handles=None, labels=None, **kw):
    """A figure legend right of the panels, off the data."""
    if handles is None:
        handles, labels = _collect(fig)
    kw.setdefault("fontsize", SMALL_PT)
    return fig.legend(handles, labels, loc="outside right upper", frameon=False, **kw)


def _collect(fig):
    seen = {}
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    return list(seen.values()), list(seen)


def setup(context: str = "notebook", font_scale: float = 1.0) -> None:
    """Apply the book's theme (call once at the top of a chapter)."""
    sns.set_theme(context=context, style="whitegrid", palette=PALETTE, font_scale=font_scale)
    plt.rcParams.update({
        "figure.dpi": FIG_DPI, "savefig.dpi": 150, "figure.figsize": figsize(4.5),
        "axes.titleweight": "bold", "axes.spines.top": False, "axes.spines.right": False,
        "legend.frameon": False, "image.cmap": SEQUENTIAL,
        "legend.fontsize": max(SMALL_PT, plt.rcParams["legend.fontsize"]
                               if isinstance(plt.rcParams["legend.fontsize"], (int, float)) else SMALL_PT),
        "legend.title_fontsize": SMALL_PT + 1,
    })


def bytes_formatter(binary: bool = False):
    """Axis tick formatter in SI bytes (kB, MB, GB, TB)."""
    return mticker.FuncFormatter(lambda x, _pos: fmt_bytes(x, 3) if x > 0 else "0")


def tokens_formatter():
    def f(x, _pos):
        for unit, v in (("M", 1 << 20), ("K", 1 << 10)):
            if x >= v:
                return f"{x / v:g}{unit}"
        return f"{x:g}"
    return mticker.FuncFormatter(f)
