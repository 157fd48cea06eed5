"""One seaborn theme and the figure helpers every chapter uses.

``setup()`` applies the theme (readable in print, colour-blind-safe palette: seaborn's
``colorblind``, with markers/line styles as a second cue). ``PALETTE`` is the one palette of the book;
``FAMILY_COLORS`` fixes a colour per attention family across chapters.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
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


def setup(context: str = "notebook", font_scale: float = 1.0) -> None:
    """Apply the book's theme (call once at the top of a chapter)."""
    sns.set_theme(context=context, style="whitegrid", palette=PALETTE, font_scale=font_scale)
    plt.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "figure.figsize": (7.5, 4.5),
        "axes.titleweight": "bold", "axes.spines.top": False, "axes.spines.right": False,
        "legend.frameon": False, "image.cmap": SEQUENTIAL,
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
