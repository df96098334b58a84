r"""Figure of the limit geometry of unnormalized attention with a general value matrix
(docs/theory/value_geometry.md).

* ``value_geometry``: tokens in :math:`\mathbb{R}^2` under :math:`\dot x_i = \sum_j P_{ij} V x_j`, drawn in the
  rescaled frame :math:`z_i = e^{-tV} x_i` (:meth:`sinkflow.Trajectory.rescaled`), SoftMax beside Sinkhorn,
  for :math:`V = I` (Geshkovski et al.'s Theorem 3.1: vertices of a polytope) and for a symmetric
  :math:`V` with a simple top eigenvalue (Theorem 4.1: at most three hyperplanes orthogonal to
  :math:`\varphi_1`), :math:`Q = K = I`. Each panel's title is :func:`sinkflow.limit_geometry` of its end
  state. Sinkhorn, which those theorems do not cover, freezes in this frame: its doubly stochastic
  attention tends to the identity assignment, so the :math:`z_i` hardly move.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow.plots import register

_NORMS = ("softmax", "sinkhorn")
_CASES = ("identity", "simple")


@dataclass(frozen=True)
class ValueGeometryConfig:
    n: int = 24
    seed: int = 2
    spread: float = 2.0
    h: float = 0.05
    steps: int = 160
    theta: float = 0.5  # angle of the top eigenvector phi_1
    second: float = -0.5  # the other eigenvalue of V (the top one is 1)
    keep_every: int = 4
    tol: float = 1e-2


def _value_matrix(case: str, cfg: ValueGeometryConfig) -> np.ndarray:
    if case == "identity":
        return np.eye(2)
    c, s = np.cos(cfg.theta), np.sin(cfg.theta)
    R = np.array([[c, -s], [s, c]])
    return R @ np.diag([1.0, cfg.second]) @ R.T


def compute_value_geometry(cfg: ValueGeometryConfig) -> dict:
    import sinkflow
    from sinkflow.clustering import GEOMETRY_KINDS

    x0 = np.random.default_rng(cfg.seed).uniform(-cfg.spread, cfg.spread, (cfg.n, 2))
    data = {"x0": x0}
    for case in _CASES:
        V = _value_matrix(case, cfg)
        data[f"{case}_V"] = V
        for norm in _NORMS:
            traj = sinkflow.simulate(x0, norm, W_V=V, h=cfg.h, steps=cfg.steps, integrator="rk4",
                                     monitors=["attention_rank"], monitor_every=cfg.steps // 8)
            z = traj.rescaled(V)
            g = sinkflow.limit_geometry(z[-1], V, W=np.eye(2), tol=cfg.tol)
            key = f"{case}_{norm}"
            data[f"{key}_paths"] = z[:: cfg.keep_every]
            data[f"{key}_final"] = z[-1]
            data[f"{key}_kind"] = GEOMETRY_KINDS.index(g.kind)
            data[f"{key}_count"] = g.count
            data[f"{key}_levels"] = np.zeros(0) if g.levels is None else g.levels
            data[f"{key}_rank"] = traj.monitors["attention_rank"]
            data[f"{key}_leaders"] = traj.monitors["attention_leaders"]
            data[f"{key}_flow_error"] = sinkflow.gradient_flow_error(traj.final / np.abs(traj.final).max(), norm,
                                                                     W_V=V) if norm == "sinkhorn" else np.nan
    return data


def plot_value_geometry(data, cfg):
    from scipy.spatial import ConvexHull

    from sinkflow.clustering import GEOMETRY_KINDS
    from sinkflow.plots.style import COLORS, LABELS, new_figure

    fig, axes = new_figure(2, 2, width=3.0, height=3.0)
    for row, case in enumerate(_CASES):
        # V = I: the plane itself; simple top eigenvalue: eigen-coordinates (<z, phi_1>, <z, phi_2>), the second
        # on a symlog axis (its eigenvalue is negative, so it grows in this frame: tokens slide along the planes)
        basis = np.eye(2) if case == "identity" else np.linalg.eigh(data[f"{case}_V"])[1][:, ::-1]
        for col, norm in enumerate(_NORMS):
            ax, key = axes[row][col], f"{case}_{norm}"
            paths, final, x0 = data[f"{key}_paths"] @ basis, data[f"{key}_final"] @ basis, data["x0"] @ basis
            ax.scatter(x0[:, 0], x0[:, 1], s=8, color="0.75", zorder=1, label="start $x_i(0)$")
            for i in range(paths.shape[1]):
                ax.plot(paths[:, i, 0], paths[:, i, 1], color=COLORS[norm], lw=0.6, alpha=0.5, zorder=2)
            ax.scatter(final[:, 0], final[:, 1], s=16, color=COLORS[norm], edgecolor="k", lw=0.4, zorder=4,
                       label="end $z_i(T)$")
            kind, count = GEOMETRY_KINDS[int(data[f"{key}_kind"])], int(data[f"{key}_count"])
            if case == "identity":
                if kind == "polytope vertices" and count >= 3:
                    hull = ConvexHull(final)
                    loop = np.append(hull.vertices, hull.vertices[0])
                    ax.plot(final[loop, 0], final[loop, 1], "k--", lw=0.9, zorder=3, label="hull / hyperplanes")
                lim = 1.1 * cfg.spread
                ax.set_xlim(-lim, lim)
                ax.set_ylim(-lim, lim)
                ax.set_aspect("equal")
                ax.set_ylabel(r"$z_2$" if col == 0 else "")
                ax.set_xlabel(r"$z_1$")
            else:
                if kind == "hyperplanes":
                    for level in data[f"{key}_levels"]:
                        ax.axvline(level, color="k", ls="--", lw=0.9, zorder=3)
                ax.set_yscale("symlog", linthresh=1.0)
                ax.set_xlim(-1.1 * cfg.spread, 1.1 * cfg.spread)
                ax.set_xlabel(r"$\langle z, \varphi_1 \rangle$ (top eigenvector)")
                ax.set_ylabel(r"$\langle z, \varphi_2 \rangle$ (symlog)" if col == 0 else "")
            what = {"polytope vertices": f"{count} vertices", "hyperplanes": f"{count} hyperplanes"}.get(
                kind, f"undetermined ({count} points)")
            rank, leaders = int(data[f"{key}_rank"][-1]), int(data[f"{key}_leaders"][-1])
            vname = "$V = I$" if case == "identity" else rf"$V$: $\lambda = 1, {cfg.second:g}$"
            ax.set_title(f"{LABELS[norm]}, {vname}\n{what}; attention rank {rank}, {leaders} leaders", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=3)
    return fig


register("value_geometry", compute=compute_value_geometry, plot=plot_value_geometry, quick=ValueGeometryConfig(),
         full=ValueGeometryConfig(n=40, steps=200), default=False,
         description="Rescaled tokens z = exp(-tV) x: polytope vertices (V = I), hyperplanes (simple top eigenvalue); "
                     "SoftMax vs Sinkhorn",
         caption=("SoftMax tokens end on polytope vertices (V = I) or at most three hyperplanes orthogonal to phi_1; "
                  "Sinkhorn's doubly stochastic attention tends to the identity, so its rescaled tokens freeze."))
