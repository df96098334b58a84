"""The map's recipe for a new attention variant works as written (docs/architecture.md).

The first Python block of the page is run as it stands; the toy variant it registers must
then drive particles, the heat layer and ``sinkflow.nn`` with the numbers of its definition.
"""

import re
from pathlib import Path

import numpy as np
import torch

import sinkflow

PAGE = Path(__file__).parents[1] / "docs" / "architecture.md"


def test_the_recipe_for_an_attention_variant_runs_through_particles_heat_and_nn():
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    ns = {}
    exec(compile(block, str(PAGE), "exec"), ns)
    assert "my_sharp_softmax" in sinkflow.available_attentions()
    assert ns["traj"].positions.shape == (6, 16, 2)
    assert ns["x_t"].shape == (16, 2) and np.isfinite(ns["x_t"]).all()
    assert ns["out"].shape == (2, 5, 8) and ns["weights"].shape == (2, 5, 5)
    # the variant is the one defined: SoftMax of twice the scores, row-stochastic
    x = torch.randn(4, 3, dtype=torch.float64)
    K = sinkflow.get_attention("my_sharp_softmax").normalize(x @ x.T, n_iter=None, mask=None).attention
    expected = torch.softmax(2 * (x @ x.T), dim=-1)
    torch.testing.assert_close(K, expected)
    torch.testing.assert_close(ns["weights"].sum(-1), torch.ones(2, 5))
