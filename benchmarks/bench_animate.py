"""Cost of an animation beyond its simulation: ``sinkflow.animate`` against the simulation it draws
and against a plain ``FuncAnimation`` that redraws the whole figure every frame (run from the
repository root, one thread).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_animate.py [--repeats 3] [--skip-reference]

The case of the contract: the classroom demo, SoftMax beside Sinkhorn on the circle, 64 particles x
200 frames (:func:`sinkflow.circle_demo`, ``animate(runs, k_star=True)``), saved as a GIF at the
default size fit for a projector (two 640 px panels: 1,280 px wide) and at the old default
(``size=2.6, dpi=72``: 374 px), rendered to the inline HTML player; and one flow of 64 particles on
the sphere S^2 (a 3-D view). Targets: the demo's GIF in at most 30 s on a laptop, each animation
a few seconds of CPU beyond the simulation. Times are CPU seconds (``time.process_time``), medians,
and the wall seconds of the same runs (with the load average: wall time depends on it, CPU time
hardly).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

import sinkflow  # noqa: E402


def cpu(fn, repeats: int) -> tuple[float, float]:
    """Median CPU and wall seconds of ``fn()`` over ``repeats`` runs."""
    times, walls = [], []
    for _ in range(repeats):
        t0, w0 = time.process_time(), time.perf_counter()
        fn()
        times.append(time.process_time() - t0)
        walls.append(time.perf_counter() - w0)
    return statistics.median(times), statistics.median(walls)


def gif_size(path) -> str:
    from PIL import Image

    with Image.open(path) as gif:
        return f"{gif.size[0]} x {gif.size[1]} px, {gif.n_frames} frames, {Path(path).stat().st_size / 1e6:.1f} MB"


def plain_html(runs) -> str:
    """The reference: one FuncAnimation redrawing two circle panels (ticks, labels, titles) every frame."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    fig, axes = plt.subplots(1, 2, figsize=(5.2, 2.95), dpi=72, layout="constrained")
    P = [np.asarray(t.positions)[::2] for t in runs.values()]  # 200 frames, as animate's default
    dots = []
    for ax, p, label in zip(axes, P, runs, strict=True):
        ax.plot(np.cos(np.linspace(0, 6.3, 200)), np.sin(np.linspace(0, 6.3, 200)), color="0.8")
        ax.set(xlim=(-1.12, 1.12), ylim=(-1.12, 1.12), aspect="equal", title=label, xlabel="$x^{(1)}$",
               ylabel="$x^{(2)}$")
        dots.append(ax.scatter(*p[0].T, s=14))
    text = fig.suptitle("")

    def update(k):
        for d, p in zip(dots, P, strict=True):
            d.set_offsets(p[k])
        text.set_text(f"t = {k * 0.1:.2f}")

    html = FuncAnimation(fig, update, frames=len(P[0])).to_jshtml(fps=20)
    plt.close(fig)
    return html


def main(argv=None) -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-reference", action="store_true", help="leave out the full-redraw reference (~40 s)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    simulation = cpu(sinkflow.circle_demo, args.repeats)
    runs = sinkflow.circle_demo()
    sphere = sinkflow.simulate(sinkflow.random_particles(64, 3, seed=0, manifold="sphere"), "softmax",
                               manifold="sphere", temperature=0.2, h=0.05, steps=199)
    with tempfile.TemporaryDirectory() as tmp:
        demo, small = Path(tmp, "demo.gif"), Path(tmp, "small.gif")
        rows = {
            "circle_demo() (the simulation, 2 x 400 steps)": simulation,
            "animate(runs, k_star=True).save('demo.gif') (defaults)":
                cpu(lambda: sinkflow.animate(runs, k_star=True).save(demo), args.repeats),
            "the same at the old default size (size=2.6, dpi=72)":
                cpu(lambda: sinkflow.animate(runs, k_star=True, size=2.6, dpi=72).save(small), args.repeats),
            "animate(runs, k_star=True).to_html()": cpu(lambda: sinkflow.animate(runs, k_star=True).to_html(),
                                                        args.repeats),
            "animate(S^2 flow, 64 x 200).save('sphere.gif')":
                cpu(lambda: sinkflow.animate(sphere).save(Path(tmp, "sphere.gif")), args.repeats),
        }
        if not args.skip_reference:
            reference = cpu(lambda: plain_html(runs), args.repeats)
            rows["reference: FuncAnimation, full redraw, to_jshtml (374 px)"] = reference
        sizes = {"demo.gif": gif_size(demo), "old size": gif_size(small),
                 "sphere.gif": gif_size(Path(tmp, "sphere.gif"))}
    width = max(map(len, rows))
    print(f"sinkflow {sinkflow.__version__} from {Path(sinkflow.__file__).parent}")
    print(f"load average at the start: {load:.1f} ({os.cpu_count()} cores); one thread")
    print(f"{'case':<{width}}  CPU s  wall s  CPU / simulation")
    for name, (seconds, wall) in rows.items():
        print(f"{name:<{width}}  {seconds:5.2f}  {wall:6.2f}  {seconds / simulation[0]:5.2f}x")
    for name, size in sizes.items():
        print(f"{name}: {size}")


if __name__ == "__main__":
    main()
