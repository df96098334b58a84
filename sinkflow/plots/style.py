"""The one matplotlib style of sinkflow: mathtext, no usetex, colour-blind safe (Okabe-Ito)."""

from __future__ import annotations

import contextlib
import re

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import LogFormatterSciNotation

__all__ = ["PALETTE", "COLORS", "LABELS", "style", "new_figure", "log_axes", "loglog_panel", "plain_log_ticks"]

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

#: How the figures name the attentions and normalizations (legends and titles).
LABELS = {
    "softmax": "SoftMax",
    "sinkhorn": "Sinkhorn",
    "softmax_gaussian": "SoftMax, Gaussian kernel",
    "softmax_dot": "SoftMax, dot product",
    "unnormalized": "unnormalized",
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


def log_axes(ax, x) -> None:
    """Log-log axes whose x ticks are the sampled values ``x``, written plainly (a range of less than a
    decade would otherwise show one labelled tick)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.xaxis.set_minor_formatter(NullFormatter())


def loglog_panel(ax, x, errors, slope, color, label, center=None, alpha=0.4) -> None:
    """Each seed's errors (columns of ``errors``, one row per value of ``x``) as dots and their
    ``center`` (default: the geometric mean) as a line labelled with the fitted ``slope``, on
    :func:`log_axes`.

    Examples
    --------
    >>> import numpy as np, matplotlib.pyplot as plt
    >>> from sinkflow.plots.style import loglog_panel
    >>> x = np.array([100, 200, 400])
    >>> fig, ax = plt.subplots()
    >>> loglog_panel(ax, x, np.c_[1 / np.sqrt(x), 1.1 / np.sqrt(x)], -0.5, "C0", "rms")
    >>> ax.get_legend_handles_labels()[1], [t.get_text() for t in ax.get_xticklabels()]
    (['rms: slope -0.50'], ['100', '200', '400'])
    >>> plt.close(fig)
    """
    import numpy as np

    center = np.exp(np.log(errors).mean(1)) if center is None else center
    for k in range(errors.shape[1]):
        ax.plot(x, errors[:, k], ".", color=color, alpha=alpha, ms=4)
    ax.plot(x, center, "o-", color=color, ms=4, label=f"{label}: slope {slope:.2f}")
    log_axes(ax, x)


_SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")
_MATHTEXT_LABEL = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")
_UNIT_DECADE = re.compile(r"(-?)(?:([0-9.]+)\\times)?10\^\{0\}")


class _PlainLogFormatter(LogFormatterSciNotation):
    r"""The log-axis tick labels of :class:`matplotlib.ticker.LogFormatterSciNotation`, the same ticks
    and the same labels, written in plain text with Unicode superscripts (``10⁻²``, ``2×10⁻²``)
    instead of mathtext (``$\mathdefault{10^{-2}}$``), and the decade of 1 plainly (``1``, ``2``, not
    ``10⁰``, ``2×10⁰``): the mathtext parser measured a third of a log figure's drawing time, once per
    label, resolution and output format.

    Examples
    --------
    >>> from sinkflow.plots.style import _PlainLogFormatter
    >>> f = _PlainLogFormatter()
    >>> f(1e-2), f(3e-5), f(1.0), f(2.0)   # the decade of 1 in plain numbers
    ('10⁻²', '3×10⁻⁵', '1', '2')
    """

    def __call__(self, x, pos=None):
        label = super().__call__(x, pos)
        match = _MATHTEXT_LABEL.match(label)
        if match is None:
            return label
        plain = _UNIT_DECADE.fullmatch(match.group(1))
        if plain is not None:  # 2×10⁰ and 10⁰ read 2 and 1
            return ("\u2212" if plain.group(1) else "") + (plain.group(2) or "1")
        text = match.group(1).replace("\\times", "\u00d7")
        text = re.sub(r"\^\{([-0-9]+)\}", lambda m: m.group(1).translate(_SUPERSCRIPT), text)
        return text.replace("-", "\u2212")  # a leading sign, as mathtext draws it


def plain_log_ticks(fig) -> None:
    """Swap every :class:`matplotlib.ticker.LogFormatterSciNotation` of ``fig`` (matplotlib's log-axis
    default, major and minor, colour bars included) for plain-text labels with the same ticks,
    values and settings (Unicode superscripts instead of mathtext); other formatters, subclasses
    included, are kept. :func:`sinkflow.plots.render` applies it to every figure it saves.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from sinkflow.plots.style import plain_log_ticks
    >>> fig, ax = plt.subplots()
    >>> _ = ax.loglog([1e-3, 1.0], [1e-3, 1.0])
    >>> plain_log_ticks(fig)
    >>> ax.xaxis.get_major_formatter()(1e-2)
    '10⁻²'
    >>> plt.close(fig)
    """
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                f = get()
                if type(f) is LogFormatterSciNotation:
                    put(_PlainLogFormatter(f._base, labelOnlyBase=f.labelOnlyBase,
                                          minor_thresholds=f.minor_thresholds, linthresh=f._linthresh))
