"""Every default figure is slide-ready: no text over text, every axis labelled, ticks that read plainly.

Drawn from the committed reference data (``figures/data/NAME.npz``, no compute) with the log tick
labels that saving gives them, so the test sees exactly the committed figures. Text artists of a
figure (titles, labels, tick labels, legend entries, annotations) must not overlap one another; no
tick reads ``10⁰`` or ``2×10⁰`` (1 and 2); an axis of fractions has no tick above 1.
"""

import itertools
import re
from pathlib import Path

import matplotlib
import pytest

from sinkflow.plots import get, read_reference, reference_path, registry
from sinkflow.plots.style import plain_log_ticks, style

matplotlib.use("Agg")

FIGURES = Path(__file__).parents[2] / "figures"
#: The default set, and figures outside it whose committed data is drawn and checked too.
CHECKED = sorted({name for name, spec in registry().items() if spec.default}
                 | {"clustering_phase_diagram", "cluster_predictions", "ds_variants_attention"})
#: Figures checked elsewhere (none today).
ELSEWHERE: set[str] = set()


def _unflatten(flat: dict) -> dict:
    """The nested dict of :func:`sinkflow.plots.flatten_data` (keys joined by '/')."""
    data = {}
    for key, value in flat.items():
        *path, last = key.split("/")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value[()] if value.ndim == 0 else value
    return data


def _drawn(name):
    spec = get(name)
    flat = read_reference(reference_path(FIGURES, name))
    assert flat, f"no committed data for {name}"
    with style():
        fig = spec.plot(_unflatten(flat), spec.config("quick"))
    plain_log_ticks(fig)  # as sinkflow.plots.render saves it
    return fig


def drawn_texts(fig) -> list:
    """``(text, box)`` of every text artist that a draw of ``fig`` actually paints (tick labels out of
    view are not painted), boxes in display pixels."""
    painted = []
    original = matplotlib.text.Text.draw

    def recording_draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            box = self.get_window_extent(renderer)
            if box.width > 0 and box.height > 0:
                painted.append((self.get_text(), box))

    matplotlib.text.Text.draw = recording_draw
    try:
        fig.canvas.draw()
    finally:
        matplotlib.text.Text.draw = original
    return painted


def overlaps(fig, margin: float = 1.0, texts=None) -> list:
    """Pairs of painted text artists (``texts``, default: :func:`drawn_texts`) whose boxes overlap by
    more than ``margin`` pixels each way."""
    found = []
    for (a, ba), (b, bb) in itertools.combinations(drawn_texts(fig) if texts is None else texts, 2):
        dx = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        dy = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if dx > margin and dy > margin:
            found.append((a, b))
    return found


def test_the_overlap_check_sees_text_over_text():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title("a title")
    ax.text(0.5, 1.0, "over the title", transform=ax.transAxes, ha="center", va="bottom")
    assert sorted(map(sorted, overlaps(fig))) == [["a title", "over the title"]]
    plt.close(fig)


#: The unit convention of axis labels. sinkflow's flows are nondimensional: positions, the time of
#: the ODE, beta, eps, densities, energies and distances are numbers without a unit (docs/theory).
#: So a label either ends with its unit in brackets ("wall time [s]", "memory [MiB]"), which a
#: measured physical quantity (MEASURED) must, or names a dimensionless quantity of this list.
DIMENSIONLESS = {
    "a count or an index": r"\b(clusters?|landmarks|particles|pairs|tokens|seeds|(half-)?iterations?|key|query|rank)\b"
                           r"|\$[nmkij]\$|\\ell\b",
    "a ratio or a fraction": r"\b(relative|fraction|contraction|rate|per|mass|probability)\b",
    "model time, a model parameter": r"(^|time )\$t\$|\\beta|\\varepsilon|\$s\$",
    "a model position or angle": r"\$x|\\theta|\bradius\b",
    "a model density, moment, energy or distance": r"\b(density|mean|(co)?variance|energy|error)\b|\\rho|E_\\beta|F\^"
                                                   r"|W_2|\\max|\\\||\\sum",
}
MEASURED = r"\b(wall|CPU|memory|seconds?|bytes?|speed)\b"


def unit_problem(label: str) -> str:
    """Why ``label`` states neither its unit nor a dimensionless quantity ('' when it does)."""
    import re

    if re.search(r"\[[^\]]+\]\s*$", label):
        return ""
    if re.search(MEASURED, label, re.IGNORECASE):
        return f"{label!r}: a measured quantity ends with its unit in brackets"
    if any(re.search(pattern, label) for pattern in DIMENSIONLESS.values()):
        return ""
    return f"{label!r}: no unit in brackets and no dimensionless quantity of DIMENSIONLESS"


def test_the_unit_check_sees_a_missing_unit():
    for label in ("wall time", "memory (peak)", "speed", "t", "amplitude"):
        assert unit_problem(label), label
    for label in ("wall time [s]", "memory [MiB]", "time $t$", "$t$", r"landmarks $m$", "clusters",
                  r"$W_2(\mu^n_t, \rho_t)$", r"half-iteration $\ell$", "relative error"):
        assert not unit_problem(label), label


#: ``10⁰`` or ``c×10⁰`` in a label (a decade of 1 written in powers of ten).
UNIT_DECADE = re.compile("(^|[^0-9])10\u2070")


def fraction_above_one(ax) -> list:
    """The ticks above 1 shown on an axis whose label says it holds a fraction."""
    found = []
    for label, ticks, lim in ((ax.get_xlabel(), ax.get_xticks(), ax.get_xlim()),
                              (ax.get_ylabel(), ax.get_yticks(), ax.get_ylim())):
        if re.search(r"\bfraction\b", label):
            tol = 1e-9 * abs(lim[1] - lim[0])  # a tick at the limit is shown (locators round it)
            found += [round(float(t), 12) for t in ticks if min(lim) - tol <= t <= max(lim) + tol and t > 1 + 1e-12]
    return found


def test_the_tick_checks_see_a_decade_of_one_and_a_fraction_above_one():
    import matplotlib.pyplot as plt

    assert [bool(UNIT_DECADE.search(t)) for t in ("10\u2070", "2\u00d710\u2070", "10\u207b\u00b9", "1", "2", "10")] \
        == [True, True, False, False, False, False]
    fig, ax = plt.subplots()
    ax.bar([1, 2], [0.2, 0.8])
    ax.set_ylabel("fraction of runs")
    ax.set_yticks([0.0, 0.6, 1.2, 1.8])
    ax.set_ylim(0, 1.2)  # 1.8 out of view
    assert fraction_above_one(ax) == [1.2]
    ax.set_ylim(0, 1.02)
    assert fraction_above_one(ax) == []
    plt.close(fig)


@pytest.mark.parametrize("name", [n for n in CHECKED if n not in ELSEWHERE])
def test_no_text_overlaps_and_every_axis_is_labelled_with_its_unit(name):
    import matplotlib.pyplot as plt

    fig = _drawn(name)
    try:
        texts = drawn_texts(fig)
        found = overlaps(fig, texts=texts)
        assert not found, f"{name}: text over text: {found}"
        decade_of_one = [text for text, _ in texts if UNIT_DECADE.search(text)]
        assert not decade_of_one, f"{name}: ticks {decade_of_one} should read 1, 2, ..."
        for ax in fig.axes:
            assert not fraction_above_one(ax), f"{name}: {ax.get_ylabel()!r} ticks {fraction_above_one(ax)} above 1"
            if ax.get_label() == "<colorbar>" or not ax.axison or not ax.get_visible():
                continue
            assert ax.get_xlabel() or not ax.get_xticklabels(), f"{name}: an x axis without a label"
            assert ax.get_ylabel() or not any(t.get_text() for t in ax.get_yticklabels()), \
                f"{name}: a y axis without a label ({ax.get_title()!r})"
            problems = [unit_problem(label) for label in (ax.get_xlabel(), ax.get_ylabel()) if label]
            assert not any(problems), f"{name}: {[p for p in problems if p]}"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", [n for n in sorted(registry()) if n not in ELSEWHERE])
def test_the_gallery_code_imports_no_private_module(name):
    # the gallery shows compute and plot: a reader copies them, so they use public names only
    # (sinkflow._backend, sinkflow.heat._x, ...: no private module at any depth)
    import inspect
    import re

    spec = get(name)
    for fn in (spec.compute, spec.plot):
        private = re.findall(r"sinkflow(?:\.\w+)*\._\w+", inspect.getsource(fn))
        assert not private, f"{name}: {fn.__name__} imports {private}; use the folder's public name"


@pytest.mark.parametrize("name", [n for n in CHECKED if n not in ELSEWHERE])
def test_every_default_figure_states_one_claim_in_a_two_line_caption(name):
    import textwrap

    caption = get(name).caption
    assert caption.strip(), f"{name}: register(..., caption='the one claim of the figure')"
    assert len(textwrap.wrap(caption, 100)) <= 2 and caption.endswith("."), f"{name}: {caption!r}"
