"""Cost of an animation beyond its simulation: ``sinkflow.animate`` against the simulation it draws
and against a plain ``FuncAnimation`` that redraws the whole figure every frame (run from the
repository root, one thread).

    OMP_NUM_THREADS=1 python benchmarks/bench_animate.py [--repeats 3]

The case of the contract: SoftMax beside Sinkhorn on the circle, 64 particles x 200 frames
(:func:`sinkflow.circle_demo`), rendered to the inline HTML player and to a GIF; and one
flow of 64 particles on the sphere S^2 (a 3-D view). Target: each animation costs at most a few
seconds of CPU beyond the simulation. Times are CPU seconds (``time.process_time``), medians.
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


def cpu(fn, repeats: int) -> float:
    """Median CPU seconds of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def plain_html(runs) -> str:
    """The reference: one FuncAnimation redrawing two circle panels (ticks, labels, titles) every frame."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    fig, axes = plt.subplots(1, 2, figsize=(5.2, 2.95), dpi=72, layout="constrained")
    P = [np.asarray(t.positions) for t in runs.values()]
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
        text.set_text(f"t = {k * 0.05:.2f}")

    html = FuncAnimation(fig, update, frames=len(P[0])).to_jshtml(fps=20)
    plt.close(fig)
    return html


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    simulation = cpu(sinkflow.circle_demo, args.repeats)
    runs = sinkflow.circle_demo()
    sphere = sinkflow.simulate(sinkflow.random_particles(64, 3, seed=0, manifold="sphere"), "softmax",
                               manifold="sphere", temperature=0.2, h=0.05, steps=199)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "circle_demo() (the simulation, 2 x 200 steps)": simulation,
            "animate(runs, k_star=True).to_html()": cpu(lambda: sinkflow.animate(runs, k_star=True).to_html(),
                                                        args.repeats),
            "animate(runs).save('demo.gif')": cpu(lambda: sinkflow.animate(runs).save(Path(tmp, "d.gif")),
                                                 args.repeats),
            "animate(S^2 flow, 64 x 200).to_html()": cpu(lambda: sinkflow.animate(sphere).to_html(), args.repeats),
            "reference: FuncAnimation, full redraw, to_jshtml": cpu(lambda: plain_html(runs), args.repeats),
        }
    width = max(map(len, rows))
    print(f"{'case':<{width}}  CPU s   / simulation")
    for name, seconds in rows.items():
        print(f"{name:<{width}}  {seconds:6.2f}   {seconds / simulation:5.2f}x")


if __name__ == "__main__":
    main()
