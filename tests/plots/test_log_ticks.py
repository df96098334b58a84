"""Plain-text log tick labels: the same ticks and values as matplotlib's mathtext labels."""

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogFormatterSciNotation  # noqa: E402

from sinkflow.plots._render import save_figure  # noqa: E402
from sinkflow.plots.style import _PlainLogFormatter, plain_log_ticks, style  # noqa: E402

_SUPER = "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
_LABEL = re.compile(f"(?:([0-9.]+)\u00d7)?10(\u207b?[{_SUPER}]+)|\u2212?[0-9.]+")


def _value(label: str) -> float:
    """The number a plain label writes, read strictly: ``c×10ᵉ``, ``10ᵉ`` or a decimal with a minus sign."""
    m = _LABEL.fullmatch(label)
    assert m is not None, label
    if m.group(2) is None:
        return float(label.replace("\u2212", "-"))
    exponent = int(m.group(2).replace("\u207b", "-").translate(str.maketrans(_SUPER, "0123456789")))
    return float(m.group(1) or 1.0) * 10.0 ** exponent


@pytest.mark.parametrize("label_only_base", [False, True])
@pytest.mark.parametrize("lim", [(1e-15, 1.0), (2e-3, 0.6), (0.05, 0.09), (1.0, 300.0)])
def test_same_ticks_and_values_as_mathtext(lim, label_only_base):
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(*lim)
    ticks = ax.yaxis.get_minorticklocs() if not label_only_base else ax.yaxis.get_majorticklocs()
    ref = LogFormatterSciNotation(labelOnlyBase=label_only_base)
    new = _PlainLogFormatter(labelOnlyBase=label_only_base)
    for f in (ref, new):
        f.set_axis(ax.yaxis)
        f.set_locs(ticks)
    for k, x in enumerate(ticks):
        a, b = ref(x, k), new(x, k)
        assert (a == "") == (b == "")
        if b:
            assert "$" not in b
            assert _value(b) == pytest.approx(x, rel=1e-9)
    plt.close(fig)


def test_rendered_figures_have_no_mathtext_log_ticks(tmp_path):
    with style():
        fig, a = plt.subplots()
        a.semilogy(np.logspace(-8, 0, 9))
        save_figure(fig, [tmp_path / "f.png"])
        labels = [t.get_text() for t in a.get_yticklabels() if t.get_text()]
        assert labels and not any("$" in t for t in labels)
        plt.close(fig)


def test_plain_log_ticks_keeps_settings():
    fig, ax = plt.subplots()
    ax.set_xscale("log", base=2, subs=[1.0, 1.5])
    before = ax.xaxis.get_major_formatter(), ax.xaxis.get_minor_formatter()
    plain_log_ticks(fig)
    after = ax.xaxis.get_major_formatter(), ax.xaxis.get_minor_formatter()
    for old, new in zip(before, after, strict=True):
        assert isinstance(new, _PlainLogFormatter)
        assert ((new._base, new.labelOnlyBase, new.minor_thresholds)
                == (old._base, old.labelOnlyBase, old.minor_thresholds))
    plt.close(fig)


def test_the_decade_of_one_reads_plainly():
    # 1, 2, 3 rather than 10⁰, 2×10⁰, 3×10⁰ (with a sign on a symlog axis); other decades keep their powers
    f = _PlainLogFormatter(labelOnlyBase=False)
    assert [f(x) for x in (1.0, 2.0, 3.0, 10.0, 0.2)] == ["1", "2", "3", "10\u00b9", "2\u00d710\u207b\u00b9"]
    fig, ax = plt.subplots()
    ax.set_yscale("symlog", linthresh=1.0)
    g = _PlainLogFormatter(linthresh=1.0)
    g.set_axis(ax.yaxis)
    assert [g(x) for x in (-1.0, 1.0)] == ["\u22121", "1"]
    plt.close(fig)
