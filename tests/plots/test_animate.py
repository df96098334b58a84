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
    import base64
    import io

    from PIL import Image

    anim = sinkflow.animate(_circle_runs(), frames=None)
    html = anim.to_html()
    assert anim._repr_html_() == html
    frames = re.findall(r"frames\[\d+\] = \"data:image/png;base64,(.*?)\"", html, flags=re.S)
    assert len(frames) == len(anim) == 9
    with Image.open(io.BytesIO(base64.b64decode(frames[-1].replace("\\n", "")))) as png:
        # 256 colours: the 200 frames of the 1,280 px demo stay under matplotlib's 20 MB limit of a player
        assert png.mode == "P" and png.size == (1280, anim.figure.get_size_inches()[1] * 100)


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
    assert anim.predicted == expected
    titles = [ax.get_title() for ax in anim.figure.axes]  # a mapping's labels are shown as given
    assert titles == [f"{name} — predicted k* = {expected[name]}, now {anim.counts[name][0]} clusters"
                      for name in expected]


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


@pytest.fixture(scope="module")
def demo():
    return sinkflow.circle_demo()


def test_the_classroom_preset_forms_k_star_clusters_then_merges(demo):
    # the demo's promise (docs/classroom.md): from one start, SoftMax has k* = 4 clusters at its formation time
    # and Sinkhorn k* = 5; by t = 20 a merge has left each one fewer
    from sinkflow.clustering import formation_time

    for label, kind in (("SoftMax", "softmax"), ("Sinkhorn", "sinkhorn")):
        traj, k = demo[label], sinkflow.fastest_mode(8.0, kind)
        formed = np.searchsorted(traj.times, formation_time(8.0, 64, kind))
        found = [count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0]))) for x in traj.positions]
        assert (found[formed], found[-1]) == (k, k - 1), (label, found[formed], found[-1])
        assert traj.times[-1] == pytest.approx(20.0)
    assert sinkflow.fastest_mode(8.0, "softmax") != sinkflow.fastest_mode(8.0, "sinkhorn")


def test_the_frame_counts_the_clusters_and_says_why_they_differ_from_k_star(demo, tmp_path):
    from sinkflow.clustering import formation_time

    anim = sinkflow.animate(demo, k_star=True, size=1.5)
    assert anim.predicted == {"SoftMax": 4, "Sinkhorn": 5}
    for label, traj in demo.items():
        at = np.searchsorted(traj.times, anim.times)
        expected = [count_clusters(angular_density(np.arctan2(x[:, 1], x[:, 0]))) for x in traj.positions[at]]
        np.testing.assert_array_equal(anim.counts[label], expected)
    t_f = formation_time(8.0, 64, "softmax")
    softmax = anim.figure.axes[0]
    for t, title, note in ((0.0, "no cluster yet", "linear phase"), (1.5 * t_f, "now 4 clusters", "clusters form"),
                           (7.0, "now 5 clusters", "more than k*: a\nneighbouring mode"),
                           (10.0, "now 4 clusters", "as predicted"), (20.0, "now 3 clusters", "clusters merged")):
        anim.still(tmp_path / "frame.png", frame=int(np.argmin(np.abs(anim.times - t))))
        assert softmax.get_title() == f"SoftMax — predicted k* = 4, {title}"
        assert note in softmax.texts[0].get_text(), (t, softmax.texts[0].get_text())
    caption = " ".join(text.get_text() for text in anim.figure.texts)
    assert "k* grows fastest" in caption and "metastable" in caption


def _ensemble(count=3, kind="sinkhorn", steps=10):
    """``count`` starts on the circle, each with its own step size, as one ensemble and as single runs."""
    x0 = np.stack([sinkflow.random_particles(10, 2, seed=s, manifold="sphere") for s in range(count)])
    h = 0.04 + 0.01 * np.arange(count)
    options = dict(manifold="sphere", temperature=0.2, steps=steps)
    singles = [sinkflow.simulate(x0[i], kind, h=float(h[i]), **options) for i in range(count)]
    return sinkflow.simulate(x0, kind, h=h, **options), singles


def test_an_ensemble_animates_as_a_grid_of_its_systems_each_as_run_alone(tmp_path):
    ens, singles = _ensemble()
    anim = sinkflow.animate(ens, frames=None, size=1.5)
    titles = [ax.get_title() for ax in anim.figure.axes]
    assert [t.split(" — ")[0] for t in titles] == ["Sinkhorn, system 0", "Sinkhorn, system 1", "Sinkhorn, system 2"]
    for k in (0, len(anim) - 1):  # each panel moves its system's particles, at that system's times
        anim.still(tmp_path / "frame.png", frame=k)
        for points, one in zip(_points(anim), singles, strict=True):
            at = np.searchsorted(one.times, anim.times[k], side="right") - 1
            np.testing.assert_allclose(points.get_offsets(), one.positions[at], atol=1e-9)
    alone = sinkflow.animate(singles[1], frames=4)
    picked = sinkflow.animate(ens, frames=4, system=1, k_star=True)
    np.testing.assert_allclose(picked.times, alone.times)
    np.testing.assert_allclose(_points(picked)[0].get_offsets(), _points(alone)[0].get_offsets())
    assert picked.figure.axes[0].get_title().startswith("Sinkhorn, system 1 — predicted k* = ")


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
    assert len(anim) == 200 and [ax.get_title() for ax in anim.figure.axes] == [
        "SoftMax — predicted k* = 4, no cluster yet", "Sinkhorn — predicted k* = 5, no cluster yet"]
    assert namespace["runs"].batch_shape == (3,)


# --- fit for a projector (issue "The classroom and the notebooks") ---------------------------------


def _texts(fig):
    """Every text a frame shows: titles, axis labels, tick labels, notes, legend, caption, clock."""
    out = [*fig.texts, *(t for legend in fig.legends for t in legend.get_texts())]
    for ax in fig.axes:
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts, *ax.get_xticklabels(), *ax.get_yticklabels()]
    return [t for t in out if t.get_text()]


def test_the_default_gif_fills_a_projector_with_text_a_room_can_read(tmp_path):
    from PIL import Image

    anim = sinkflow.animate(_circle_runs(n=8, steps=4), frames=3, k_star=True)  # two circle panels, defaults
    with Image.open(anim.save(tmp_path / "flow.gif")) as gif:
        assert gif.size[0] >= 1280 and gif.size[1] >= 640, gif.size
        assert gif.n_frames == 3
        assert gif.convert("RGB").getpixel((gif.size[0] - 2, gif.size[1] // 2)) == (255, 255, 255)  # white, no tint
    # every text at least 19.2 px a font size: capitals (0.73 of it in DejaVu Sans) at least 14 px high
    smallest = min(t.get_fontsize() for t in _texts(anim.figure)) * anim.figure.dpi / 72
    assert smallest >= 19.2, smallest
    sphere = sinkflow.simulate(sinkflow.random_particles(6, 3, seed=0, manifold="sphere"), "softmax",
                               manifold="sphere", steps=2)
    with Image.open(sinkflow.animate(sphere, frames=2).save(tmp_path / "sphere.gif")) as gif:
        assert gif.size[0] >= 640 and gif.size[1] >= 640, gif.size  # a square panel of S^2


def test_size_and_dpi_change_the_resolution_not_the_picture():
    runs = _circle_runs(n=8, steps=4)
    big, small = sinkflow.animate(runs, frames=2), sinkflow.animate(runs, frames=2, size=3.2, dpi=50)
    assert big.figure.get_size_inches()[0] * big.figure.dpi == 1280
    np.testing.assert_allclose(big.figure.get_size_inches() * big.figure.dpi / 4,
                               small.figure.get_size_inches() * small.figure.dpi, atol=1)
    for a, b in zip(_texts(big.figure), _texts(small.figure), strict=True):
        assert a.get_fontsize() == pytest.approx(2 * b.get_fontsize())
    np.testing.assert_allclose([ax.get_position().bounds for ax in big.figure.axes],
                               [ax.get_position().bounds for ax in small.figure.axes], atol=0.01)


def test_the_frame_names_its_panels_and_explains_its_colours():
    x0 = sinkflow.random_particles(8, 2, seed=0, manifold="sphere")
    one = sinkflow.simulate(x0, "softmax", manifold="sphere", steps=2)
    anim = sinkflow.animate(one, frames=2)
    assert anim.figure.axes[0].get_title().split(" — ")[0] == "SoftMax"  # not "softmax"
    (legend,) = anim.figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["one colour: one cluster at the end", "start", "ends alone"]
    clusters, start, alone = legend.legend_handles
    assert start.get_markerfacecolor() == "none" and alone.get_markerfacecolor() != "none"
    ring = anim.figure.axes[0].collections[0]  # the start: hollow rings, unlike the filled grey loners
    assert len(ring.get_facecolors()) == 0 and ring.get_edgecolors()[0, 3] == 1
    np.testing.assert_allclose(ring.get_offsets(), x0)


def test_the_clock_stands_clear_of_the_frame_corner():
    # issue 43's check: "t = 20.00" sat 5 px from the frame's corner, where a projector or a player crops it
    for size in (sinkflow.plots._animate.PANEL_SIZE, 3.2):
        anim = sinkflow.animate(_circle_runs(n=6, steps=2), frames=2, size=size)
        fig = anim.figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # the layout, as a saved frame has it
        renderer = canvas.get_renderer()
        (clock,) = [t for t in fig.texts if t.get_text().startswith("t = ")]
        box = clock.get_window_extent(renderer)
        font = clock.get_fontsize() * fig.dpi / 72  # px
        assert box.x0 >= 0.8 * font, (size, box.x0, font)  # a margin of about a character's height
        assert fig.bbox.height - box.y1 >= 0.3 * font, (size, fig.bbox.height - box.y1, font)
        titles = [ax.title.get_window_extent(renderer) for ax in fig.axes]
        assert all(box.y0 >= t.y1 or box.x1 <= t.x0 for t in titles), "the clock overlaps a panel title"


def test_an_animation_never_rendered_leaves_without_a_warning():
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        anim = sinkflow.animate(_circle_runs(n=6, steps=2), frames=2)
        del anim
        gc.collect()
    assert not [w for w in caught if "deleted without rendering" in str(w.message)]


def test_a_still_is_one_frame_as_the_animation_shows_it(tmp_path):
    from PIL import Image

    anim = sinkflow.animate(_circle_runs(n=8, steps=6), frames=4, size=2.0)
    path = anim.still(tmp_path / "end.png")
    with Image.open(path) as png, Image.open(anim.save(tmp_path / "flow.gif")) as gif:
        assert png.size == gif.size
        gif.seek(3)
        diff = np.abs(np.asarray(png.convert("RGB"), float) - np.asarray(gif.convert("RGB"), float))
    assert diff.mean() < 1 and (diff > 40).mean() < 1e-3  # the same picture, in the GIF's 256 colours
    np.testing.assert_allclose(_points(anim)[0].get_offsets(), _circle_runs(n=8, steps=6)["softmax"].final)
    with pytest.raises(ValueError, match=r"\.png"):
        anim.still(tmp_path / "end.jpg")
    with pytest.raises(IndexError):
        anim.still(tmp_path / "end.png", frame=4)


def test_the_classroom_table_prints_the_prediction_beside_every_seed(capsys):
    from sinkflow.clustering import classroom_study

    rows = classroom_study.classroom_counts(betas=(5.0,), seeds=range(3), n=16, t_end=1.0)
    assert [(r["normalization"], r["beta"], r["k_star"]) for r in rows] == [("softmax", 5.0, 3), ("sinkhorn", 5.0, 4)]
    table = classroom_study.markdown(rows).splitlines()
    assert table[0] == ("| attention | $\\beta$ | $k^*$ | $t_f$ | count at $t_f$ | count at $2t_f$ | "
                        "count at $t = 1$ |")
    row = re.compile(r"\| (SoftMax|Sinkhorn) \| 5 \| [34] \| \d+\.\d \|( [0-9]( [0-9]){2} \(\d/3\) \|){3}")
    assert len(table) == 4 and all(row.fullmatch(line) for line in table[2:]), table
    assert table[2].endswith(f"({int(np.sum(rows[0]['at_end'] == 3))}/3) |")
    classroom_study.main(["--betas", "5", "--seeds", "3", "--n", "16", "--t-end", "1"])
    assert capsys.readouterr().out.strip().endswith("\n".join(table))


def test_the_classroom_page_shows_the_table_its_command_prints():
    from pathlib import Path

    from sinkflow.clustering import classroom_study

    page = (Path(__file__).parents[2] / "docs" / "classroom.md").read_text()
    assert "python -m sinkflow.clustering.classroom_study" in page
    assert classroom_study.markdown(classroom_study.classroom_counts()) in page
    still = re.search(r"\]\((_static/[\w.]+\.png)\)|```\{image\} (_static/[\w.]+\.png)", page)
    assert still and (Path(__file__).parents[2] / "docs" / (still[1] or still[2])).is_file()
