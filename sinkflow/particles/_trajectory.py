"""What a particle flow returns (:class:`Trajectory`) and the checks shared by one system and an
ensemble: the manifolds, the Sinkhorn tolerance of a dtype, positions on the sphere.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, check_number, squared_norms
from sinkflow._checks import check_index

__all__ = ["MANIFOLDS", "Trajectory", "default_tol"]

MANIFOLDS = ("euclidean", "sphere")


@dataclass(frozen=True)
class Trajectory:
    """A simulated particle flow.

    Attributes
    ----------
    times : numpy.ndarray (n_saved,)
        Times of the saved states (``k h``); ``(n_saved, ...)`` for an ensemble with a ``h`` per system.
    positions : array (n_saved, ..., n, d)
        Saved states, same type/device/dtype as ``x0`` (``n_saved = steps + 1`` with
        ``save_every=1``); ``...`` is the batch shape of an ensemble (none for one system).
    monitors : dict[str, numpy.ndarray]
        Recorded quantities, one value per ``monitor_times`` (and system); the keys of each
        monitor are listed under ``monitors`` in :func:`simulate` (``"cluster_count"`` is an
        integer array; a monitor's name as a key raises a ``KeyError`` naming its keys).
    monitor_times : numpy.ndarray
    sinkhorn_iterations : numpy.ndarray (steps, ...)
        Updates of the Sinkhorn potentials per step (all stages of RK4 summed), per system; each
        update is one pass of matrix-vector products over the kernel. With a fixed ``n_iter`` it is
        ``n_iter`` (half-iterations, whatever the solver). To tolerance it counts the steps of the
        solver that ran: half-iterations of the alternating loop (a general ``W_Q^T W_K``; its
        closing Newton steps are not counted), or steps of the symmetric solver (heavy-ball or
        Newton; a symmetric positive semi-definite ``W_Q^T W_K``, dense or harmonic field), each
        updating row and column potentials at once; a symmetric solve that the general solver
        finishes adds the general solver's half-iterations. Zeros without Sinkhorn.
    converged : bool or numpy.ndarray (...) of bool
        Whether every run-to-tolerance Sinkhorn solve reached its tolerance (per system).
    attention, integrator, manifold : str
    h : float or numpy.ndarray (...)
    n_iter : int or None
    temperature : float or numpy.ndarray (...)
    weights : array (..., n) or None
    chunked : bool
        Whether the field was evaluated block-wise (:mod:`sinkflow.particles`).
    landmarks : int or None
        Number of landmarks of an approximate flow (:mod:`sinkflow.particles`).
    harmonic_order : int or None
        Truncation order (:math:`K` on the circle, :math:`L` on :math:`S^2`) of the exact fast
        harmonic field, when :func:`simulate` chose it (:func:`sinkflow.particles.harmonic_attention_field`);
        a step whose smallest row this order does not certify runs at the guaranteed order.
    """

    times: np.ndarray
    positions: Any
    monitors: dict = field(default_factory=dict)
    monitor_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sinkhorn_iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    converged: bool = True
    attention: str = "sinkhorn"
    integrator: str = "euler"
    manifold: str = "euclidean"
    h: float = 0.1
    n_iter: int | None = None
    temperature: float = 1.0
    weights: Any = None
    chunked: bool = False
    landmarks: int | None = None
    harmonic_order: int | None = None

    @property
    def final(self):
        """The last saved state, ``positions[-1]``."""
        return self.positions[-1]

    @property
    def steps(self) -> int:
        return len(self.sinkhorn_iterations)

    @property
    def batch_shape(self) -> tuple:
        """The leading batch shape of an ensemble (:func:`sinkflow.simulate` with ``x0`` of shape
        ``(..., n, d)``); ``()`` for one system."""
        return tuple(np.shape(self.positions)[1:-2])

    def system(self, index) -> Trajectory:
        """One system of an ensemble, as the :class:`Trajectory` of that system alone.

        Parameters
        ----------
        index : int or tuple of int
            A multi-index into :attr:`batch_shape`, or one int counting the systems in C order
            (``traj.system(5)`` of a ``(2, 3)`` batch is ``traj.system((1, 2))``); negative
            counts from the end.

        Returns
        -------
        Trajectory
            Its positions ``(n_saved, n, d)``, times, monitors (``"cluster_count"`` stays an
            integer array), iterations, ``h``, temperature and weights; as the run of that system
            alone.

        Raises
        ------
        ValueError
            The trajectory is one system, or ``index`` is outside the batch.
        TypeError
            ``index`` is neither an int nor a tuple of ints.

        Examples
        --------
        >>> import numpy as np, sinkflow
        >>> x0 = np.stack([sinkflow.random_particles(8, 2, seed=s, manifold="sphere") for s in range(3)])
        >>> ens = sinkflow.simulate(x0, "softmax", manifold="sphere", steps=4, monitors=["clusters"])
        >>> ens.batch_shape, ens.system(-1).positions.shape, ens.system(2).monitors["cluster_count"].dtype.kind
        ((3,), (5, 8, 2), 'i')
        """
        index = check_index(index, self.batch_shape, "system")

        def at(v):  # arrays with a time axis first
            return v if v is None else v[(slice(None),) + index]

        def per_time(v):  # times shared by every system when h is
            return at(v) if np.ndim(v) > 1 else v

        def per_system(v):
            return v if np.ndim(v) == 0 else v[index].item()

        return replace(self, positions=at(self.positions), times=per_time(self.times),
                       monitors=type(self.monitors)({k: at(v) for k, v in self.monitors.items()}),
                       monitor_times=per_time(self.monitor_times), sinkhorn_iterations=at(self.sinkhorn_iterations),
                       converged=bool(np.asarray(self.converged)[index]), h=per_system(self.h),
                       temperature=per_system(self.temperature),
                       weights=None if self.weights is None or np.ndim(self.weights) == 1 else self.weights[index])

    def plot(self, ax=None, *, paths: bool = True, cluster_tol: float = 1e-2, system=None):
        """Draw the flow as a still: the paths, the start (grey) and the end coloured by cluster.

        The plane, the circle (``manifold="sphere"``, ``d = 2``) or the sphere :math:`S^2` in a
        3-D view. For the animation, :func:`sinkflow.animate`.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw (a 3-D axes for ``d = 3``); a new figure by default.
        paths : bool
            Draw every particle's path.
        cluster_tol : float
            :math:`\\delta` of :func:`sinkflow.particles.cluster_labels` on the final state
            (the colours); particles that end alone are grey.
        system : int or tuple of int, optional
            For an ensemble: draw this system alone (:meth:`system`). Without it an ensemble draws
            its first systems on a grid of its own, three a row, at most six (a warning says how
            many were left out).

        Returns
        -------
        matplotlib Axes
            One Axes; for an ensemble without ``system``, a numpy array of them (one per system).

        Raises
        ------
        ValueError
            ``ax`` given for a whole ensemble, ``system`` of a one-system flow or outside the batch.

        Examples
        --------
        >>> import sinkflow
        >>> x0 = sinkflow.random_particles(16, 2, seed=0, manifold="sphere")
        >>> traj = sinkflow.simulate(x0, "softmax", manifold="sphere", temperature=0.2, steps=20)
        >>> ax = traj.plot()
        >>> ax.get_title()
        'softmax, t = 2'
        """
        from sinkflow.particles._draw import plot_trajectory

        return plot_trajectory(self, ax, paths=paths, cluster_tol=cluster_tol, system=system)


def default_tol(dtype: torch.dtype) -> float:
    """Sinkhorn marginal tolerance of a flow in ``dtype``: 1e-10 in float64, else the solver's default.

    A marginal error sums ``n`` entries of relative rounding ``eps``; float32 cannot go
    much below ``1e-6`` (a float64-level ``tol`` would make every solve stop at its floor),
    see :func:`sinkflow.attention.default_tolerance`.

    Parameters
    ----------
    dtype : torch.dtype
        Floating dtype of the particles.

    Returns
    -------
    float

    Examples
    --------
    >>> import torch
    >>> from sinkflow.attention import default_tolerance
    >>> from sinkflow.particles import default_tol
    >>> default_tol(torch.float64)
    1e-10
    >>> default_tol(torch.float32) == default_tolerance(torch.float32) > default_tol(torch.float64)
    True
    """
    from sinkflow.attention._tolerances import default_tolerance

    return 1e-10 if dtype == torch.float64 else default_tolerance(dtype)


def _solver_tol(tol, dtype) -> float:
    floor = default_tol(dtype)
    if tol is None:
        return floor
    tol = float(check_number(tol, "tol", positive=True))
    if dtype != torch.float64 and tol < floor:
        warnings.warn(f"tol={tol:g} is below what {dtype} Sinkhorn solves reach; using {floor:.2g} "
                      "(pass float64 particles for tighter solves)", RuntimeWarning, stacklevel=3)
        return floor
    return tol


def _check_positions(X, manifold, batched: bool = False):
    check_float(X, "x0")
    if (X.ndim != 2 and not batched) or X.ndim < 2 or X.shape[-2] < 1 or X.shape[-1] < 1:
        raise ValueError(f"x0 must have shape {'(..., ' if batched else '('}n, d) with n, d >= 1, got {tuple(X.shape)}")
    check_finite(X.detach(), "x0")
    if manifold == "sphere":
        dev = float((squared_norms(X.detach()).sqrt_() - 1).abs_().max())
        if dev > (1e-8 if X.dtype == torch.float64 else 1e-5):
            raise ValueError(f"manifold='sphere' needs x0 on the unit sphere (max | |x_i| - 1 | = {dev:.3g}); "
                             "normalize it, e.g. x0 / np.linalg.norm(x0, axis=1, keepdims=True)")
