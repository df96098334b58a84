"""sinkflow.animate, Trajectory.plot and the classroom preset: frames, colours, limits, files, errors."""

import re

import matplotlib
import numpy as np
import pytest
from scipy.special import ive

import sinkflow
from sinkflow.clustering import angular_density, count_clusters

matplotlib.use("Agg")


def _circle_runs(n=12, steps=8, beta=5.0):
    x0 = sinkflow.random_particles(n, 2, seed=2, manifold="sphere")
    return {kind: sinkflow.simulate(x0, kind, manifold="sphere", temperature=1 / beta, h=0.05, steps=steps)
            for kind in ("softmax", "sinkhorn")}


def _points(anim):
    """The moving scatter of each panel (the last collection drawn on it)."""
    return [ax.collections[-1] for ax in anim.figure.axes]


def test_a_saved_gif_has_one_frame_per_time_and_ends_on_the_final_state(tmp_path):
    from PIL import Image

    traj = sinkflow.simulate(sinkflow.random_particles(10, 2, seed=0), "sinkhorn", h=0.05, steps=12)
    anim = sinkflow.animate(traj, frames=7, fps=5)
    path = anim.save(tmp_path / "flow.gif")
    with Image.open(path) as gif:
        assert gif.n_frames == len(anim) == 7
        first = np.asarray(gif.convert("RGB"))
        gif.seek(6)
        last = np.asarray(gif.convert("RGB"))
    assert np.abs(first.astype(int) - last.astype(int)).sum() > 0  # the particles moved
    np.testing.assert_allclose(anim.times, traj.times[np.linspace(0, 12, 7).round().astype(int)])
    np.testing.assert_allclose(_points(anim)[0].get_offsets(), traj.final)  # the last frame drawn is the end
    assert path.read_bytes() == anim.to_gif()  # the bytes a notebook stores, no file needed
    assert repr(anim) == "<ParticleAnimation: 7 frames, t = 0 to 0.6, 1 panel(s), 5 fps>"


def test_the_html_player_embeds_every_frame():
    anim = sinkflow.animate(_circle_runs(), frames=None)
    html = anim.to_html()
    assert anim._repr_html_() == html
    assert len(re.findall(r"frames\[\d+\] = \"data:image/png;base64", html)) == len(anim) == 9


def test_panels_side_by_side_share_limits_and_colour_by_final_cluster():
    runs = _circle_runs(n=16, steps=40, beta=8.0)
    anim = sinkflow.animate(runs, frames=3, cluster_tol=0.05)
    axes = anim.figure.axes
    assert len(axes) == 2 and axes[0].get_xlim() == axes[1].get_xlim() and axes[0].get_ylim() == axes[1].get_ylim()
    for points, traj in zip(_points(anim), runs.values(), strict=True):
        colors = points.get_facecolors()
        final = traj.final
        close = final @ final.T > 1 - 0.05  # the cluster relation, here with direct links only
        same_color = np.all(colors[:, None, :] == colors[None, :, :], axis=2)
        assert np.all(same_color[close])  # neighbours at the end share a colour


def test_k_star_titles_follow_the_bessel_rates():
    beta = 5.0
    anim = sinkflow.animate(_circle_runs(beta=beta), frames=2, k_star=True)
    k = np.arange(1, 30)
    i0, ik = ive(0, beta), ive(k, beta)
    expected = {"softmax": k[np.argmax(k ** 2 * ik / i0)], "sinkhorn": k[np.argmax(k ** 2 * ik / (i0 + ik))]}
    assert [ax.get_title() for ax in anim.figure.axes] == [f"{name}: $k^* = {expected[name]}$" for name in expected]


def test_the_sphere_is_drawn_in_3d():
    x0 = sinkflow.random_particles(8, 3, seed=0, manifold="sphere")
    traj = sinkflow.simulate(x0, "softmax", manifold="sphere", h=0.05, steps=4)
    anim = sinkflow.animate(traj, frames=3)
    assert anim.figure.axes[0].name == "3d"
    assert traj.plot().name == "3d"


def test_trajectory_plot_draws_the_start_the_paths_and_the_end():
    import matplotlib.pyplot as plt

    traj = sinkflow.simulate(sinkflow.random_particles(6, 2, seed=0), "softmax", h=0.1, steps=5)
    ax = traj.plot()
    assert len(ax.lines) == 6 and len(ax.collections) == 2
    np.testing.assert_allclose(ax.collections[-1].get_offsets(), traj.final)
    np.testing.assert_allclose(ax.collections[0].get_offsets(), traj.positions[0])
    assert ax.get_xlabel() and ax.get_ylabel()
    plt.close("all")


def test_bad_inputs_are_refused_naming_the_parameter(tmp_path, monkeypatch):
    from matplotlib import animation

    runs = _circle_runs(steps=2)
    plane = sinkflow.simulate(sinkflow.random_particles(4, 2, seed=0), "softmax", steps=2)
    with pytest.raises(TypeError, match="trajectories"):
        sinkflow.animate([plane])
    with pytest.raises(TypeError, match=r"trajectories\['x'\]"):
        sinkflow.animate({"x": plane.positions})
    with pytest.raises(ValueError, match="empty"):
        sinkflow.animate({})
    with pytest.raises(ValueError, match="share manifold"):
        sinkflow.animate({"a": plane, **runs})
    with pytest.raises(ValueError, match="k_star"):
        sinkflow.animate(plane, k_star=True)
    with pytest.raises(ValueError, match="d = 2 or 3"):
        sinkflow.animate(sinkflow.simulate(sinkflow.random_particles(4, 4, seed=0), "softmax", steps=1))
    anim = sinkflow.animate(plane, frames=2)
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        anim.save(tmp_path / "flow.avi")
    monkeypatch.setattr(animation.writers, "is_available", lambda name: False)
    with pytest.raises(RuntimeError, match="ffmpeg"):
        anim.save(tmp_path / "flow.mp4")


def test_cluster_labels_number_clusters_by_size():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert sinkflow.cluster_labels(x).tolist() == [2, 0, 0, 1, 0, 1]
    assert sinkflow.cluster_labels(x).max() + 1 == sinkflow.cluster_statistics(x)[1]


def test_the_classroom_preset_ends_with_the_predicted_clusters():
    # the demo's promise: from one start, SoftMax ends with k* = 4 clusters and Sinkhorn with k* = 5
    runs = sinkflow.circle_demo()
    for label, kind in (("SoftMax", "softmax"), ("Sinkhorn", "sinkhorn")):
        x = runs[label].final
        found = count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0])))
        assert found == sinkflow.fastest_mode(8.0, kind), (label, found)
    assert sinkflow.fastest_mode(8.0, "softmax") != sinkflow.fastest_mode(8.0, "sinkhorn")


def _ensemble(count=3, kind="sinkhorn", steps=10):
    """``count`` starts on the circle, each with its own step size, as one ensemble and as single runs."""
    x0 = np.stack([sinkflow.random_particles(10, 2, seed=s, manifold="sphere") for s in range(count)])
    h = 0.04 + 0.01 * np.arange(count)
    options = dict(manifold="sphere", temperature=0.2, steps=steps)
    singles = [sinkflow.simulate(x0[i], kind, h=float(h[i]), **options) for i in range(count)]
    return sinkflow.simulate(x0, kind, h=h, **options), singles


def test_an_ensemble_animates_as_a_grid_of_its_systems_each_as_run_alone():
    ens, singles = _ensemble()
    anim = sinkflow.animate(ens, frames=None)
    assert [ax.get_title() for ax in anim.figure.axes] == ["sinkhorn [0]", "sinkhorn [1]", "sinkhorn [2]"]
    for k in (0, len(anim) - 1):  # each panel moves its system's particles, at that system's times
        anim.animation._func(k)
        for points, one in zip(_points(anim), singles, strict=True):
            at = np.searchsorted(one.times, anim.times[k], side="right") - 1
            np.testing.assert_allclose(points.get_offsets(), one.positions[at], atol=1e-9)
    alone = sinkflow.animate(singles[1], frames=4)
    picked = sinkflow.animate(ens, frames=4, system=1, k_star=True)
    np.testing.assert_allclose(picked.times, alone.times)
    np.testing.assert_allclose(_points(picked)[0].get_offsets(), _points(alone)[0].get_offsets())
    assert picked.figure.axes[0].get_title().startswith("sinkhorn [1]: $k^*")


def test_a_large_ensemble_draws_at_most_six_panels_and_says_so():
    ens, _ = _ensemble(count=8, steps=2)
    with pytest.warns(UserWarning, match="first 6 .*system=i"):
        anim = sinkflow.animate(ens, frames=2)
    assert len(anim.figure.axes) == 6
    with pytest.warns(UserWarning, match="first 3"):  # two ensembles: one row of 3 each
        anim = sinkflow.animate({"a": ens, "b": ens}, frames=2)
    rows = sorted({round(ax.get_position().y0, 3) for ax in anim.figure.axes})
    assert len(anim.figure.axes) == 6 and len(rows) == 2
    with pytest.raises(ValueError, match="outside"):
        sinkflow.animate(ens, system=8)
    with pytest.raises(ValueError, match="one system"):
        sinkflow.animate(_circle_runs(steps=2), system=0)


def test_an_ensemble_plots_each_system_as_run_alone():
    import matplotlib.pyplot as plt

    ens, singles = _ensemble(steps=4)
    axes = ens.plot()
    assert len(axes) == 3
    for ax, one in zip(axes, singles, strict=True):
        np.testing.assert_allclose(ax.collections[-1].get_offsets(), one.final, atol=1e-9)
    ax = ens.plot(system=2)
    np.testing.assert_allclose(ax.collections[-1].get_offsets(), singles[2].final, atol=1e-9)
    with pytest.raises(ValueError, match="system=i"):
        ens.plot(ax=ax)
    plt.close("all")


def test_the_classroom_page_runs_as_written():
    # issue 31's promise: the demo in three lines from docs/classroom.md, then the page's other snippets, as a
    # teacher pastes them (one namespace, in order)
    import textwrap
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "classroom.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    demo = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(demo) == 3, "the demo is three lines"
    namespace = {}
    for block in blocks:
        exec(compile(textwrap.dedent(block), "classroom.md", "exec"), namespace)
    anim = namespace["anim"]
    assert len(anim) == 200
    assert [ax.get_title() for ax in anim.figure.axes] == ["SoftMax: $k^* = 4$", "Sinkhorn: $k^* = 5$"]
    assert namespace["runs"].batch_shape == (3,)
