"""Plots of tidy tables: one line per group of a sweep's results (:func:`sinkflow.sweep`).

Not a figure module: it registers nothing, and draws what a user's sweep computed.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["plot_sweep"]


def plot_sweep(df, x: str, y: str | list[str], hue: str | None = None, *, ax=None, logx: bool = False,
               logy: bool = False, labels: Mapping[str, str] | None = None, colors: Mapping | None = None,
               band: bool = True):
    r"""Plot a sweep table: ``y`` against ``x``, one line per ``hue`` value, in the sinkflow style.

    Rows sharing ``(hue, x)`` (e.g. several seeds) are averaged; with ``band`` their
    min-max range is shaded.

    Parameters
    ----------
    df : pandas.DataFrame
        A table from :func:`sweep`.
    x, hue : str
        Column names; ``hue`` is optional.
    y : str or list of str
        One or more result columns (several: one line style per column).
    ax : matplotlib Axes, optional
        Draw into it; by default a new figure is made.
    logx, logy : bool
        Logarithmic axes.
    labels : dict, optional
        Axis and legend labels per column (mathtext welcome, e.g. ``{"scale": r"$s$"}``).
    colors : dict, optional
        Colour per ``hue`` value (or per ``y`` column without ``hue``); by default the
        sinkflow palette in order.
    band : bool
        Shade the min-max range over repeated rows.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import pandas as pd
    >>> from sinkflow.plots.tables import plot_sweep
    >>> df = pd.DataFrame({"n": [8, 8, 16, 16], "seed": [0, 1, 0, 1], "err": [1.0, 1.2, 0.5, 0.7]})
    >>> fig = plot_sweep(df, "n", "err", logy=True)
    >>> fig.axes[0].get_ylabel()
    'err'
    """
    from sinkflow.plots.style import PALETTE, new_figure, style

    labels = dict(labels or {})
    ys = [y] if isinstance(y, str) else list(y)
    missing = [c for c in [x, hue, *ys] if c is not None and c not in df.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the table; it has {list(df.columns)}")
    with style():
        if ax is None:
            fig, axes = new_figure(1, 1, width=4.0, height=3.0)
            ax = axes[0, 0]
        fig = ax.figure
        colors = dict(colors or {})
        groups = [(None, df)] if hue is None else list(df.groupby(hue, sort=True))
        styles = ["-", "--", ":", "-."]
        for gi, (hv, sub) in enumerate(groups):
            for yi, col in enumerate(ys):
                # without hue, each column gets a colour; with hue, each hue value does
                key, k = (col, yi) if hue is None else (hv, gi)
                color = colors.get(key, PALETTE[k % len(PALETTE)])
                stats = sub.groupby(x, sort=True)[col].agg(["mean", "min", "max", "count"])
                name = labels.get(col, col)
                if hue is not None:
                    hue_label = f"{labels.get(hue, hue)} = {hv}"
                    name = hue_label if len(ys) == 1 else f"{name}, {hue_label}"
                linestyle = "-" if hue is None else styles[yi % len(styles)]
                ax.plot(stats.index, stats["mean"], linestyle, marker="o", ms=3, color=color, label=name)
                if band and (stats["count"] > 1).any():
                    ax.fill_between(stats.index, stats["min"], stats["max"], color=color, alpha=0.2, lw=0)
        ax.set_xlabel(labels.get(x, x))
        ax.set_ylabel(labels.get(ys[0], ys[0]) if len(ys) == 1 else "")
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        if hue is not None or len(ys) > 1:
            ax.legend()
    return fig
