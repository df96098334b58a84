"""Every default figure is slide-ready: no text over text, every axis labelled.

Drawn from the committed reference data (``figures/data/NAME.npz``, no compute), so the test
sees exactly the committed figures. Text artists of a figure (titles, labels, tick labels,
legend entries, annotations) must not overlap one another.
"""

import itertools
from pathlib import Path

import matplotlib
import pytest

from sinkflow.plots import get, read_reference, reference_path, registry
from sinkflow.plots.style import style

matplotlib.use("Agg")

FIGURES = Path(__file__).parents[2] / "figures"
#: The default set, and figures outside it whose committed data is drawn and checked too.
CHECKED = sorted({name for name, spec in registry().items() if spec.default} | {"clustering_phase_diagram"})
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
        return spec.plot(_unflatten(flat), spec.config("quick"))


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


def overlaps(fig, margin: float = 1.0) -> list:
    """Pairs of painted text artists whose boxes overlap by more than ``margin`` pixels each way."""
    found = []
    for (a, ba), (b, bb) in itertools.combinations(drawn_texts(fig), 2):
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


@pytest.mark.parametrize("name", [n for n in CHECKED if n not in ELSEWHERE])
def test_no_text_overlaps_and_every_axis_is_labelled_with_its_unit(name):
    import matplotlib.pyplot as plt

    fig = _drawn(name)
    try:
        found = overlaps(fig)
        assert not found, f"{name}: text over text: {found}"
        for ax in fig.axes:
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
