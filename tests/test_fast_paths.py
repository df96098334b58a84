"""The one switch of the speed tricks (``sinkflow.fast_paths``): each surviving trick is on its path when the
switch is on and off it when the switch is off (the trick patched to raise is then never reached), and the
numbers agree both ways. The oracle of each path is the same call with the trick off: torch's plain operations.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import sinkflow
import sinkflow._backend
import sinkflow.fields._dense_fields as dense_fields
import sinkflow.fields._ensemble_fields as ensemble_fields
import sinkflow.fields._harmonic_solvers as harmonic_solvers
import sinkflow.plots._render as render_module
from sinkflow._backend import numpy_exp_applies, numpy_exp_is_fast


def _raising(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} was reached with the speed tricks off")
    return refuse


def _both_ways(run, monkeypatch, target, attribute):
    """``run()`` with the switch on (the trick reached: patched to raise, it raises) and off (patched to raise,
    never reached); returns the two results, each computed unpatched."""
    results = {}
    for on in (True, False):
        with sinkflow.fast_paths(on):
            results[on] = run()
            with monkeypatch.context() as m:
                m.setattr(target, attribute, _raising(attribute))
                with pytest.raises(AssertionError, match="was reached") if on else contextlib.nullcontext():
                    run()
    return results[True], results[False]


def _close(a, b, atol):
    a, b = np.asarray(a), np.asarray(b)
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a / scale, b / scale, rtol=0, atol=atol)


@pytest.mark.parametrize("kw", [{"chunked": True}, {"landmarks": 64}], ids=["blockwise", "landmarks"])
def test_blockwise_and_landmark_flows_exponentiate_through_numpy_only_with_the_switch_on(kw, monkeypatch):
    """numpy's exp in the blocks (forced here whatever this CPU's numpy: the route itself) when on; the same
    trajectory to rounding (numpy's and torch's exp agree to a few ulp)."""
    monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: True)
    x0 = torch.tensor(sinkflow.random_particles(400, 2, seed=3))

    def run():
        with sinkflow.torch_threads(1):
            return sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=3, temperature=0.5, **kw).positions

    on, off = _both_ways(run, monkeypatch, np, "exp")
    _close(on, off, 1e-13)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_an_ensemble_runs_its_numpy_passes_only_with_the_switch_on(attention, monkeypatch):
    """The ensemble field's passes in numpy (its batched products through ``numpy.matmul``) when on, torch's
    operations when off: the same trajectories of 6 systems on the circle."""
    x0 = torch.tensor(np.stack([sinkflow.random_particles(16, 2, seed=s, manifold="sphere") for s in range(6)]))
    monkeypatch.setattr(ensemble_fields, "SMALL_ENSEMBLE", 0)  # 6 SoftMax systems through the ensemble field too

    def run():
        return sinkflow.simulate(x0, attention, h=0.05, steps=4, manifold="sphere", temperature=0.2).positions

    on, off = _both_ways(run, monkeypatch, np, "matmul")
    _close(on, off, 1e-12)


@pytest.mark.parametrize("attention", ["softmax", "sinkhorn"])
def test_a_harmonic_field_takes_numpy_passes_only_with_the_switch_on(attention, monkeypatch):
    """On the circle at N = 600 ``simulate`` takes the harmonic field; its passes are numpy's when on, torch's
    when off, and the trajectories agree (to the solve's tolerance for Sinkhorn)."""
    x0 = torch.tensor(sinkflow.random_particles(600, 2, seed=5, manifold="sphere"))
    seen = []
    init = harmonic_solvers._Passes.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.numpy)
    monkeypatch.setattr(harmonic_solvers._Passes, "__init__", spy)
    runs = {}
    for on in (True, False):
        seen.clear()
        with sinkflow.fast_paths(on):
            traj = sinkflow.simulate(x0, attention, h=0.1, steps=3, manifold="sphere", temperature=0.2, tol=1e-11)
        assert "harmonic" in str(traj.evaluation) and seen and set(seen) == {on}
        runs[on] = traj.positions
    _close(runs[True], runs[False], 1e-9)


def test_a_small_flow_goes_to_one_thread_only_with_the_switch_on(monkeypatch):
    """``single_thread_if_small``: n <= 256 on the CPU runs on one torch thread when on; off, torch's setting."""
    x0 = torch.tensor(sinkflow.random_particles(16, 3, seed=1, manifold="sphere"))

    def run():
        with sinkflow.torch_threads(2):
            return sinkflow.simulate(x0, "softmax", h=0.1, steps=3, manifold="sphere").positions

    on, off = _both_ways(run, monkeypatch, dense_fields, "torch_threads")
    _close(on, off, 1e-14)


def test_the_warm_start_half_norms_are_numpy_only_with_the_switch_on():
    """A symmetric Sinkhorn flow's warm start: its half norms in numpy when on, torch when off; equal values,
    and the same trajectory to the solve's tolerance."""
    x0 = torch.tensor(sinkflow.random_particles(32, 2, seed=2))
    runs = {}
    for on in (True, False):
        with sinkflow.fast_paths(on):
            field = sinkflow.fields.ParticleField.__new__(sinkflow.fields.ParticleField)
            field.W, field.temperature = None, 0.5
            half = sinkflow.fields.ParticleField._half_norms(field, x0)
            assert isinstance(half, np.ndarray) is on
            np.testing.assert_allclose(np.asarray(half), (x0 * x0).sum(-1).numpy() / 1.0, rtol=1e-15)
            runs[on] = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=5, temperature=0.2, tol=1e-12).positions
    _close(runs[True], runs[False], 1e-10)


def test_figures_are_cut_from_one_drawing_only_with_the_switch_on(tmp_path, monkeypatch):
    """``save_figure`` lays the figure out in one Agg drawing and cuts the PNG from it when on; off, matplotlib's
    own ``bbox_inches="tight"``. The PNGs have the same size in pixels (within one) and nearly the same pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.image import imread

    def run():
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.semilogy(np.arange(1, 10), np.arange(1, 10) ** 2, label="squares")
        ax.set_xlabel("n")
        ax.legend()
        path = tmp_path / f"f{len(list(tmp_path.iterdir()))}.png"
        try:
            render_module.save_figure(fig, [path])
        finally:  # also when the patched trick raises: no figure left open
            plt.close(fig)
        return imread(path)

    on, off = _both_ways(run, monkeypatch, render_module, "_draw_once")
    assert abs(on.shape[0] - off.shape[0]) <= 1 and abs(on.shape[1] - off.shape[1]) <= 1
    h, w = min(on.shape[0], off.shape[0]), min(on.shape[1], off.shape[1])
    assert float(np.abs(on[:h, :w] - off[:h, :w]).mean()) < 0.02


def test_numpy_exp_is_taken_only_where_numpy_runs_its_avx512_loop(monkeypatch):
    """The exp route's CPU gate: numpy's report of its float64 exp loop (AVX-512 or not), and no route without it."""
    from numpy.lib.introspect import opt_func_info

    current = opt_func_info(func_name="^exp$")["exp"]["dd"]["current"]
    assert numpy_exp_is_fast() is ("X86_V4" in current or "AVX512" in current)
    x = torch.ones(3)
    with sinkflow.torch_threads(1):
        monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: False)
        assert not numpy_exp_applies(x)
        monkeypatch.setattr(sinkflow._backend, "numpy_exp_is_fast", lambda: True)
        assert numpy_exp_applies(x)
        with sinkflow.fast_paths(False):
            assert not numpy_exp_applies(x)
