"""Every committed PNG in figures/ is what the current plotting code draws from the committed data.

``sinkflow figures`` leaves a figure untouched while its recomputed data agree with the reference data
(``--force`` redraws it), and ``--check`` compares data and file hashes, never pixels: a change of the
plotting code alone (ticks, labels, a legend) left ``nystrom_error_vs_landmarks.png`` showing the old
ticks. Here each figure is drawn again from its committed reference data (``figures/data/NAME.npz``, no
compute) the way ``sinkflow figures`` saves it, and compared with the committed PNG pixel by pixel.

About 1-3 s a figure: an integration test (CI's second pytest command), like the notebooks and the docs build.
"""

from pathlib import Path

import matplotlib
import numpy as np
import pytest

from sinkflow.plots import read_manifest, read_reference, reference_path, render

matplotlib.use("Agg")

FIGURES = Path(__file__).parents[2] / "figures"
ROWS = {r["figure"]: r for r in read_manifest(FIGURES).values() if r["file"].endswith(".png")}

#: Pixels allowed to differ by more than :data:`LEVELS` (of 255, in any channel): antialiasing at rounding
#: level (0.001 % measured); one changed tick label or legend word moves about 0.05 % or more (the stale
#: nystrom_error_vs_landmarks.png: 0.25 %).
FRACTION, LEVELS = 1e-4, 40


def drawn_difference(name: str, tmp_path: Path) -> float:
    """The fraction of pixels of figure ``name``'s committed PNG that a redraw from the committed data changes by
    more than LEVELS."""
    from PIL import Image

    row = ROWS[name]
    data = read_reference(reference_path(FIGURES, name))
    assert data, f"no committed data for {name}"
    (png,) = render(name, mode=row["mode"], out=tmp_path, formats=("png",), data=data, force=True)
    with Image.open(png) as new, Image.open(FIGURES / row["file"]) as old:
        if new.size != old.size:
            return 1.0
        diff = np.abs(np.asarray(new.convert("RGB"), int) - np.asarray(old.convert("RGB"), int)).max(axis=2)
    return float((diff > LEVELS).mean())


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(ROWS))
def test_committed_figure_is_what_the_current_code_draws(name, tmp_path):
    changed = drawn_difference(name, tmp_path)
    assert changed <= FRACTION, (
        f"figures/{name}.png differs from what the current plotting code draws from its committed data "
        f"({changed:.3%} of the pixels): redraw it with `sinkflow figures {name} --force`, look at it, commit it")
