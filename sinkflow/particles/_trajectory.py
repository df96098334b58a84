"""What a particle flow returns (:class:`Trajectory`) and the checks shared by one system and an
ensemble: the manifolds, the Sinkhorn tolerance of a dtype, positions on the sphere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from sinkflow._backend import check_finite, check_float, check_number
from sinkflow._checks import check_index, warn_caller
from sinkflow._optional import require
from sinkflow._summary import Summarized, as_numpy, describe_array, number, png_data_uri, span

__all__ = ["MANIFOLDS", "Trajectory", "default_tol"]

MANIFOLDS = ("euclidean", "sphere")


@dataclass(frozen=True, repr=False)
class Trajectory(Summarized):
    """A simulated particle flow.

    It summarizes itself: ``repr(traj)`` (what a Jupyter cell or the terminal shows) is a few
    lines (shapes, attention, integrator, steps and time span, Sinkhorn convergence and
    iterations, evaluation, monitors), never the arrays; in Jupyter the same facts show as a
    table beside a still of the start and end positions (:meth:`_repr_html_`). For analysis,
    :meth:`to_xarray` (positions) and :meth:`to_dataframe` (monitors).

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
    evaluation : EvaluationPath or None
        How the field was evaluated and why, chosen once before the first step: ``evaluation.name`` is
        ``"dense"``, ``"block-wise"``, ``"landmarks"``, ``"harmonic"`` or, for the systems of an ensemble
        run as one tensor flow, ``"batched"``; ``evaluation.reason`` says what decided it
        (``print(traj.evaluation)``).
    norm : Placement or None
        The normalization placement of the run (``simulate(..., norm=...)``; docs/theory/placements.md), or
        None for the flow without one.

    Examples
    --------
    >>> import sinkflow
    >>> x0 = sinkflow.random_particles(16, 2, seed=0, manifold="sphere")
    >>> traj = sinkflow.simulate(x0, "sinkhorn", manifold="sphere", temperature=0.5, steps=20)
    >>> traj  # doctest: +ELLIPSIS
    <Trajectory> 21 states x 16 tokens x 2 coordinates, numpy float64, sphere
      attention: sinkhorn; temperature: 0.5; integrator: euler; h: 0.1; steps: 20 (t = 0 to 2)
      Sinkhorn: to tolerance, converged; iterations per step: ... (max ...)
      evaluation: dense (one n x n matrix fits the dense budget of 512 MiB); weights: uniform
    >>> page = traj._repr_html_()   # what Jupyter shows: the same facts in a table, and a still
    >>> "<table" in page, "data:image/png;base64," in page
    (True, True)
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
    evaluation: Any = None
    norm: Any = None

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
        'SoftMax, t = 2'
        """
        from sinkflow.particles._draw import plot_trajectory

        return plot_trajectory(self, ax, paths=paths, cluster_tol=cluster_tol, system=system)

    # ------------------------------------------------------------------ summaries (sinkflow._summary)
    def _evaluation(self) -> str:
        """How the field was evaluated: the recorded :attr:`evaluation` (every :func:`sinkflow.simulate` run
        records it), else, for a trajectory built by hand, read from ``harmonic_order``, ``landmarks``
        and ``chunked``."""
        if self.evaluation is not None:
            return str(self.evaluation)
        if self.harmonic_order is not None:
            return f"harmonic (order {self.harmonic_order})"
        if self.landmarks is not None:
            return f"landmarks (m = {self.landmarks})"
        return "chunked (block-wise)" if self.chunked else "dense"

    def _sinkhorn_facts(self) -> list[tuple[str, str]]:
        """Iterations per step, the solves' stopping rule and convergence, the worst error if known."""
        its = np.asarray(self.sinkhorn_iterations)
        if self.attention != "sinkhorn" and not its.any():
            return []
        if self.n_iter is not None:
            facts = [("Sinkhorn", f"n_iter = {self.n_iter} per solve (fixed)")]
        else:
            ok = np.asarray(self.converged, dtype=bool)
            state = "converged" if ok.all() else (f"NOT converged in {int((~ok).sum())}/{ok.size} systems"
                                                  if ok.ndim else "NOT converged")
            facts = [("Sinkhorn", f"to tolerance, {state}")]
        worst = getattr(self, "marginal_error", None)
        if worst is None and "row_error" in self.monitors:
            worst = max(float(np.nanmax(self.monitors[k])) for k in ("row_error", "column_error") if k in self.monitors)
        if worst is not None:
            facts.append(("worst marginal error", number(worst)))
        if its.size:
            per_step = its.reshape(len(its), -1)
            facts.append(("iterations per step", f"{number(per_step.mean())} (max {int(per_step.max())})"))
        return facts

    def _facts(self):
        shape = tuple(np.shape(self.positions))
        n_saved, n, d = shape[0], shape[-2], shape[-1]
        batch = self.batch_shape
        systems = f" x {int(np.prod(batch))} systems {batch}" if batch else ""
        head = (f"{n_saved} state{'s' * (n_saved != 1)}{systems} x {n} tokens x {d} coordinates, "
                f"{describe_array(self.positions)}, {self.manifold}")
        times = np.asarray(self.times, dtype=float).reshape(len(self.times), -1)
        t0, t1 = (times[0].min(), span(times[-1]).replace(" to ", "..")) if times.size else (0.0, "0")
        flow = [("attention", self.attention), ("temperature", span(self.temperature)),
                ("integrator", self.integrator), ("h", span(self.h)),
                ("steps", f"{self.steps} (t = {number(t0)} to {t1})")]
        if self.norm is not None:
            flow.insert(1, ("norm", _placement_text(self.norm)))
        rest = [("evaluation", self._evaluation()),
                ("weights", "uniform" if self.weights is None else "given")]
        if self.monitors:
            rest.append(("monitors", f"{', '.join(self.monitors)} at {len(self.monitor_times)} times"))
        return head, [flow, self._sinkhorn_facts(), rest]

    def _html_extra(self) -> str:
        return f'<img src="{self._still_png()}" alt="start (grey) and end positions" style="margin-top:4px">'

    def _still_png(self, size: float = 2.2, dpi: int = 60, max_points: int = 2000) -> str:
        """A small PNG (a data URI) of the start (grey) and end positions (the first system of an
        ensemble; the first two coordinates), drawn on a bare :class:`matplotlib.figure.Figure`: no
        pyplot, no change of matplotlib's global state."""
        import io

        from matplotlib.figure import Figure

        first = (0,) * len(self.batch_shape)
        start = as_numpy(self.positions[(0, *first)]).astype(float)
        end = as_numpy(self.positions[(-1, *first)]).astype(float)
        keep = np.linspace(0, len(end) - 1, min(len(end), max_points)).astype(int)
        start, end = start[keep], end[keep]
        if start.shape[-1] == 1:  # a line: the coordinate against zero
            start, end = np.pad(start, ((0, 0), (0, 1))), np.pad(end, ((0, 0), (0, 1)))
        fig = Figure(figsize=(size, size), dpi=dpi)
        ax = fig.add_axes((0.03, 0.03, 0.94, 0.94))
        if self.manifold == "sphere":
            angle = np.linspace(0, 2 * np.pi, 200)
            ax.plot(np.cos(angle), np.sin(angle), color="0.85", lw=0.8)
        ax.scatter(start[:, 0], start[:, 1], s=5, color="0.7", linewidths=0)
        ax.scatter(end[:, 0], end[:, 1], s=9, color="#1f77b4", linewidths=0)
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xticks([])
        ax.set_yticks([])
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        return png_data_uri(buffer.getvalue())

    def rescaled(self, V):
        r"""The positions in the frame of the value matrix: :math:`z_i(t) = e^{-tV} x_i(t)`.

        Without normalization the tokens of :math:`\dot x_i = \sum_j P_{ij} V x_j` grow like
        :math:`e^{tV}`; Geshkovski, Letrouit, Polyanskiy and Rigollet (NeurIPS 2023,
        arXiv:2305.05465) read the limit geometry off :math:`z_i`, which solves
        :math:`\dot z_i = \sum_j P_{ij} V (z_j - z_i)` (rows of ``P`` summing to 1) and stays bounded
        (docs/theory/value_geometry.md). :func:`sinkflow.limit_geometry` classifies the last state.

        Parameters
        ----------
        V : array (d, d) or torch.Tensor
            The value matrix the flow ran with (``W_V`` of :func:`sinkflow.simulate`; pass
            ``np.eye(d)`` for its default). The exponential is computed in float64
            (``torch.linalg.matrix_exp``) at each saved time.

        Returns
        -------
        array (n_saved, ..., n, d)
            Same type, device and dtype as :attr:`positions` (detached).

        Raises
        ------
        ValueError
            The flow ran on the sphere (the rescaling belongs to the Euclidean model), or ``V`` is
            not a finite ``(d, d)`` matrix.

        Examples
        --------
        >>> import numpy as np, sinkflow
        >>> x0 = sinkflow.random_particles(6, 2, seed=0)
        >>> traj = sinkflow.simulate(x0, "softmax", W_V=2 * np.eye(2), h=0.01, steps=50, integrator="rk4")
        >>> z = traj.rescaled(2 * np.eye(2))
        >>> z.shape, bool(np.abs(z).max() < 2 * np.abs(x0).max())   # bounded, while |x| grew ~ e^{2t}
        ((51, 6, 2), True)
        """
        if self.manifold != "euclidean":
            raise ValueError(f"rescaled needs a Euclidean flow (z = exp(-tV) x), got manifold={self.manifold!r}")
        X = torch.as_tensor(self.positions).detach() if not isinstance(self.positions, torch.Tensor) \
            else self.positions.detach()
        d = X.shape[-1]
        Vt = torch.as_tensor(V.detach() if isinstance(V, torch.Tensor) else np.asarray(V, dtype=float),
                             dtype=torch.float64, device=X.device)
        if Vt.shape != (d, d):
            raise ValueError(f"V must be a (d, d) = ({d}, {d}) matrix, got shape {tuple(Vt.shape)}")
        if not bool(torch.isfinite(Vt).all()):
            raise ValueError("V must be finite")
        t = torch.as_tensor(np.asarray(self.times, dtype=float), dtype=torch.float64, device=X.device)
        t = t.reshape(t.shape + (1,) * (X.ndim - 2 - t.ndim))  # (n_saved, batch...) broadcast over the batch
        M = torch.linalg.matrix_exp(-t[..., None, None] * Vt)  # (n_saved, [batch], d, d)
        Z = X.to(torch.float64) @ M.transpose(-1, -2)
        if isinstance(self.positions, torch.Tensor):
            return Z.to(self.positions.dtype)
        return Z.numpy().astype(np.asarray(self.positions).dtype, copy=False)

    # ------------------------------------------------------------------ analysis
    def _system_dims(self) -> list[str]:
        batch = self.batch_shape
        return ["system"] if len(batch) == 1 else [f"system_{i}" for i in range(len(batch))]

    def to_xarray(self):
        """The saved positions as a labelled :class:`xarray.DataArray` (``pip install 'sinkflow[analysis]'``).

        Returns
        -------
        xarray.DataArray
            ``positions`` (numpy, detached and copied to the CPU; half precisions as float32) with
            dims ``("time", [system...], "token", "coordinate")``: an ensemble's batch dimensions
            are ``"system"`` (one) or ``"system_0", "system_1", ...``. Coordinates: ``time`` (the
            saved times) and ``step`` (their step counts, ``times / h``); with a ``h`` per system
            the times differ by system, so ``time`` is then a coordinate over ``("time", system...)``
            and ``step`` alone indexes the time axis. Attributes: ``attention``, ``manifold``,
            ``integrator`` (strings), ``n_iter`` (an int, or ``"to tolerance"``), ``steps``, and
            ``h`` and ``temperature`` when shared by every system; per-system values of ``h``,
            ``temperature`` and ``converged`` are coordinates over the system dims.

        Raises
        ------
        ImportError
            xarray is not installed (the ``analysis`` extra).

        Examples
        --------
        >>> import sinkflow
        >>> x0 = sinkflow.random_particles(8, 2, seed=0, manifold="sphere")
        >>> da = sinkflow.simulate(x0, "softmax", manifold="sphere", steps=4).to_xarray()
        >>> da.dims, da.shape, da.attrs["attention"], da.attrs["n_iter"]
        (('time', 'token', 'coordinate'), (5, 8, 2), 'softmax', 'to tolerance')
        >>> float(da.time[-1])
        0.4
        """
        xr = require("xarray", "Trajectory.to_xarray")
        system_dims = self._system_dims() if self.batch_shape else []
        dims = ["time", *system_dims, "token", "coordinate"]
        times = np.asarray(self.times, dtype=float)
        first_h = float(np.asarray(self.h, dtype=float).ravel()[0])  # the steps are shared by every system
        steps = np.rint(times.reshape(len(times), -1)[:, 0] / first_h).astype(int)
        coords = {"step": ("time", steps)}
        coords["time"] = ("time", times) if times.ndim == 1 else (["time", *system_dims], times)
        attrs = {"attention": str(self.attention), "manifold": str(self.manifold), "integrator": str(self.integrator),
                 "n_iter": "to tolerance" if self.n_iter is None else int(self.n_iter), "steps": self.steps}
        if self.norm is not None:
            attrs["norm"] = _placement_text(self.norm)
        for name, value in (("h", self.h), ("temperature", self.temperature), ("converged", self.converged)):
            if np.ndim(value):
                coords[name] = (system_dims, np.asarray(value))
            else:  # netCDF attributes hold no booleans
                attrs[name] = int(bool(value)) if name == "converged" else float(value)
        return xr.DataArray(as_numpy(self.positions), dims=dims, coords=coords, attrs=attrs, name="positions")

    def to_dataframe(self):
        """The recorded monitors as a tidy (long) :class:`pandas.DataFrame` (``pip install 'sinkflow[analysis]'``).

        One row per monitor time, system and monitor key: ``len(monitor_times) x systems x len(monitors)``
        rows, in that order (time first, then system, then key).

        Returns
        -------
        pandas.DataFrame
            Columns ``time``, then ``system`` (an ensemble with one batch dimension) or
            ``system_0, system_1, ...`` (several; none for one system), then ``monitor`` (the key,
            e.g. ``"energy"``, ``"cluster_count"``) and ``value`` (float; integer monitors such as
            ``cluster_count`` are exact in it). ``df.pivot_table(index="time", columns="monitor",
            values="value")`` gives one column per monitor.

        Raises
        ------
        ImportError
            pandas is not installed (the ``analysis`` extra).

        Examples
        --------
        >>> import sinkflow
        >>> x0 = sinkflow.random_particles(8, 2, seed=0, manifold="sphere")
        >>> traj = sinkflow.simulate(x0, "softmax", manifold="sphere", steps=4, monitors=["energy", "clusters"])
        >>> df = traj.to_dataframe()
        >>> list(df.columns), len(df), sorted(set(df.monitor))
        (['time', 'monitor', 'value'], 15, ['cluster_count', 'cluster_fraction', 'energy'])
        """
        pd = require("pandas", "Trajectory.to_dataframe", extra="analysis")
        batch = self.batch_shape
        system_dims = self._system_dims() if batch else []
        keys = list(self.monitors)
        T = len(self.monitor_times)
        grid = np.indices((T, *batch, len(keys))).reshape(len(batch) + 2, -1)  # time, systems..., key (C order)
        times = np.broadcast_to(np.asarray(self.monitor_times, dtype=float).reshape((T,) + (1,) * len(batch)
                                if np.ndim(self.monitor_times) == 1 else (T, *batch)), (T, *batch))
        values = np.stack([np.asarray(self.monitors[k], dtype=float).reshape(T, *batch) for k in keys], -1) \
            if keys else np.zeros((T, *batch, 0))
        columns = {"time": times[tuple(grid[:-1])]}
        columns.update({name: grid[1 + i] for i, name in enumerate(system_dims)})
        columns["monitor"] = np.asarray(keys, dtype=object)[grid[-1]] if keys else np.zeros(0, dtype=object)
        columns["value"] = values.reshape(-1)
        return pd.DataFrame(columns)


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
        warn_caller(f"tol={tol:g} is below what {dtype} Sinkhorn solves reach; using {floor:.2g} "
                      "(pass float64 particles for tighter solves)", RuntimeWarning)
        return floor
    return tol


def _check_positions(X, manifold, batched: bool = False):
    check_float(X, "x0")
    if (X.ndim != 2 and not batched) or X.ndim < 2 or X.shape[-2] < 1 or X.shape[-1] < 1:
        raise ValueError(f"x0 must have shape {'(..., ' if batched else '('}n, d) with n, d >= 1, got {tuple(X.shape)}")
    if manifold != "sphere":
        check_finite(X.detach(), "x0")
        return
    # one pass for both checks: the norms are finite exactly when every entry is (NaN and inf propagate)
    shortest, longest = (float(r) for r in torch.aminmax(torch.linalg.vector_norm(X.detach(), dim=-1)))
    if not (math.isfinite(shortest) and math.isfinite(longest)):
        check_finite(X.detach(), "x0")  # raises, naming x0 (a norm that overflowed: finite entries, off the sphere)
    dev = max(longest - 1, 1 - shortest)
    if dev > (1e-8 if X.dtype == torch.float64 else 1e-5):
        raise ValueError(f"manifold='sphere' needs x0 on the unit sphere (max | |x_i| - 1 | = {dev:.3g}); "
                         "normalize it, e.g. x0 / np.linalg.norm(x0, axis=1, keepdims=True)")


def _placement_text(norm) -> str:
    """A placement in a few words: ``"peri"``, ``"pre (rms)"``, ``"mix (split 0.25)"``."""
    name = getattr(norm, "name", str(norm))
    extra = [] if getattr(norm, "normalization", "sphere") == "sphere" else [norm.normalization]
    extra += [f"split {norm.split:g}"] if name == "mix" else []
    extra += [f"alpha {norm.alpha:g}"] if name == "ngpt" and norm.alpha != 1 else []
    return f"{name} ({', '.join(extra)})" if extra else name
