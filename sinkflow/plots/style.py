"""The one matplotlib style of sinkflow: mathtext, no usetex, colour-blind safe (Okabe-Ito)."""

from __future__ import annotations

import contextlib

import matplotlib
import matplotlib.pyplot as plt

__all__ = ["PALETTE", "COLORS", "style", "new_figure"]

#: Okabe & Ito (2008) colour-blind safe palette.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

#: Fixed colours per concept, so every figure tells the same story.
COLORS = {
    "softmax": "#D55E00",
    "sinkhorn": "#0072B2",
    "unnormalized": "#009E73",
    "gaussian": "#CC79A7",
    "reference": "#000000",
    "bound": "#E69F00",
    "other": "#56B4E9",
}

RC = {
    "text.usetex": False,
    "mathtext.fontset": "dejavusans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.4,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "image.cmap": "viridis",
    "svg.hashsalt": "sinkflow",
    "pdf.fonttype": 3,  # glyph outlines, text still extractable; TrueType (42) subsetting doubled the PDF time
}


@contextlib.contextmanager
def style():
    """Apply the sinkflow style inside a ``with`` block and leave no global state behind.

    On exit every rcParam (interactive mode included) is back to its value on entry, and the
    pyplot backend is the one pyplot would have chosen without the block.

    Examples
    --------
    >>> import matplotlib
    >>> before = dict(matplotlib.rcParams)
    >>> with style():
    ...     matplotlib.rcParams["font.size"]
    9.0
    >>> dict(matplotlib.rcParams) == before
    True
    """
    # Load the pyplot backend *before* the snapshot: loading it has side effects that belong to
    # the session, not to the block (IPython's inline backend switches interactive mode on), and
    # a snapshot taken earlier would revert them on exit, hiding every later figure in Jupyter.
    plt.draw_if_interactive()  # public entry to pyplot's backend selection; draws nothing new
    with plt.rc_context(RC):
        yield


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 3.2, height: float = 2.8, **kwargs):
    """A figure with ``nrows x ncols`` axes of the given per-panel size (inches)."""
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                        layout="constrained", **kwargs)
