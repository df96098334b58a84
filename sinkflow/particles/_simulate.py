r"""Particle simulators: a residual attention layer is an explicit Euler step.

docs/theory/gradient_flows.md and docs/theory/sphere.md. Tokens :math:`x_i` move by

.. math:: x_i \leftarrow x_i + h \sum_j K_{ij}(X)\, W_V x_j

(:mod:`sinkflow.particles` defines :math:`K` for each attention kind); RK4 with the same
field is the continuous-depth reference. On the sphere (the layer-norm model of
Geshkovski et al.) the velocity is projected by :math:`P_x^\perp = I - x x^T` and
each step is followed by renormalization.

Monitors follow py-pde's trackers: quantities recorded along the run, every
``monitor_every`` steps, returned in :attr:`Trajectory.monitors`:

``"energy"``
    the energy of the flow: :math:`F^\infty` (sinkhorn), :math:`F^0` (unnormalized),
    :math:`F^\infty` as a common yardstick for softmax, the Gaussian analogue of :math:`F^0`
    (gaussian), :math:`E_\beta` on the sphere (which assumes :math:`Q = K = V = I`)
    (:mod:`sinkflow.particles`; evaluated with :math:`W = W_Q^T W_K / \tau`).
``"energy_inf"``, ``"energy_0"``
    :math:`F^\infty` or :math:`F^0` whatever the attention kind.
``"marginal_errors"``
    row and column marginal errors of the attention used at that state
    (keys ``"row_error"``, ``"column_error"``): how far from doubly stochastic.
``"clusters"``
    fraction of clustered pairs (:math:`\langle x_i, x_j\rangle > 1 - \delta` on the sphere,
    :math:`\|x_i - x_j\|^2 < 2\delta\, \overline{|x|^2}` in Euclidean space, :math:`\delta` =
    ``cluster_tol``) and the number of clusters (connected components of that relation);
    keys ``"cluster_fraction"``, ``"cluster_count"``.
"""

from __future__ import annotations

import numpy as np
import torch

from sinkflow._backend import check_number, check_seed, leading
from sinkflow._checks import check_numpy_float
from sinkflow.attention._variants import get_attention
from sinkflow.fields._dense_fields import check_matrix, check_weights
from sinkflow.particles._ensembles import is_ensemble, simulate_ensemble
from sinkflow.particles._settings import checked_settings
from sinkflow.particles._system import run_system
from sinkflow.particles._trajectory import MANIFOLDS, Trajectory, _check_positions, default_tol

__all__ = ["simulate", "Trajectory", "random_particles", "default_tol"]

# ----------------------------------------------------------------------------------------
# helpers


def random_particles(n: int, d: int, *, seed=0, manifold: str = "euclidean", scale: float = 1.0, like=None):
    """Reproducible random initial particles.

    Gaussian :math:`\\mathcal{N}(0, \\mathrm{scale}^2 I_d)` in Euclidean space, uniform on
    the unit sphere :math:`S^{d-1}` for ``manifold="sphere"``.

    Parameters
    ----------
    n, d : int
        Number and dimension of the particles.
    seed : int or numpy.random.Generator
    manifold : {"euclidean", "sphere"}
    scale : float
        Standard deviation (Euclidean only).
    like : torch.Tensor, optional
        Return a tensor with this device and dtype (numpy float64 otherwise).

    Returns
    -------
    array (n, d)

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x = sinkflow.random_particles(4, 3, seed=1, manifold="sphere")
    >>> bool(np.allclose(np.linalg.norm(x, axis=1), 1))
    True
    """
    if manifold not in MANIFOLDS:
        raise ValueError(f"manifold must be one of {MANIFOLDS}, got {manifold!r}")
    n = check_number(n, "n", integer=True, positive=True)
    d = check_number(d, "d", integer=True, positive=True)
    scale = check_number(scale, "scale", positive=True)
    rng = np.random.default_rng(check_seed(seed))
    x = rng.standard_normal((n, d))
    if manifold == "sphere":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    else:
        x *= scale
    return x if like is None else torch.as_tensor(x, dtype=like.dtype, device=like.device)


# ----------------------------------------------------------------------------------------
# the field of one simulation, its integrators and monitors (py-pde's solvers and trackers)


# ----------------------------------------------------------------------------------------
# the simulator


def simulate(x0, attention="sinkhorn", W_Q=None, W_K=None, W_V=None, h: float = 0.1, steps: int = 100, *,
             n_iter=None, weights=None, integrator: str = "euler", manifold: str = "euclidean",
             temperature: float = 1.0, monitors=(), monitor_every: int = 1, save_every: int = 1,
             warm_start: bool | None = None, chunked: bool | None = None, landmarks: int | None = None,
             landmark_seed: int = 0, landmark_sampling: str = "farthest", tol: float | None = None,
             max_iter: int = 20_000, cluster_tol: float = 1e-3, progress: bool | None = None,
             causal: bool = False, norm=None) -> Trajectory:
    r"""Simulate tokens moving under self-attention (a residual network of depth ``steps``).

    Parameters
    ----------
    x0 : array (..., n, d) or torch.Tensor
        Initial particles. Leading dimensions are an ensemble of independent systems (see
        Notes). numpy in -> numpy out; torch in (``x0`` or any of ``W_Q``, ``W_K``,
        ``W_V``, ``weights``) -> torch out on that tensor's device and dtype (CUDA works
        unchanged; float16 / bfloat16 landmark fields are computed in float32). Must be finite, floating (numpy defaults
        to float64), and on the unit sphere for ``manifold="sphere"``. A torch ``x0`` (or
        ``W_Q``, ``W_K``, ``W_V``) that requires grad gives positions with an autograd graph
        (dense evaluation only).
    attention : str or AttentionVariant
        ``"sinkhorn"``, ``"softmax"``, ``"unnormalized"``, ``"gaussian"``, ``"skyformer"``,
        ``"nystromformer"`` or any name added with :func:`sinkflow.register_attention`
        (:mod:`sinkflow.attention`).
    W_Q, W_K, W_V : arrays (..., d, d), optional
        Query, key and value matrices (identity by default); the scores are
        :math:`x_i^T W_Q^T W_K x_j / \tau`. The gradient-flow theorem holds for
        :math:`W = W_Q^T W_K / \tau` symmetric and :math:`W_V = W` (descent of the energy).
    h : float or array (...)
        Step size (> 0; one per system of an ensemble); Euler with step ``h`` is a residual layer. A ``RuntimeWarning``
        names the largest safe value when ``h`` exceeds the field's stability scale
        (:func:`lipschitz_scale`, normalized attentions).
    steps : int
        Number of steps (>= 0).
    n_iter : int or None
        Sinkhorn half-iterations per field evaluation; ``None`` runs to ``tol``.
    weights : array (..., n), optional
        Positive particle weights summing to 1 (the empirical measure); uniform by default.
        Conserved by the flow (mass moves with the particles).
    integrator : {"euler", "rk4"}
    manifold : {"euclidean", "sphere"}
    temperature : float or array (...)
        :math:`\tau > 0` (:math:`\beta = 1/\tau` on the sphere), one per system of an ensemble.
    monitors : str or iterable of str
        Any of these, each writing its keys of :attr:`Trajectory.monitors` (one value per
        ``monitor_times``; module docstring):

        - ``"energy"``: key ``"energy"``, the energy whose descent the flow is checked against;
        - ``"energy_inf"``, ``"energy_0"``: keys ``"energy_inf"``, ``"energy_0"``;
        - ``"marginal_errors"``: keys ``"row_error"``, ``"column_error"``;
        - ``"clusters"``: keys ``"cluster_fraction"`` (float) and ``"cluster_count"`` (integer).
        - ``"attention_rank"``: keys ``"attention_rank"`` and ``"attention_leaders"`` (integers,
          :func:`sinkflow.particles.attention_rank`; one system, an ``n x n`` attention matrix).

        Asking for a monitor's name instead of its key raises a ``KeyError`` naming its keys.
    monitor_every, save_every : int
        Record monitors / positions every so many steps (the last state is always kept).
    warm_start : bool, optional
        Start each Sinkhorn solve from the previous column potential (``init_g``). Default:
        True for ``n_iter=None`` (same fixed point, far fewer iterations), False for a
        fixed ``n_iter`` (each layer normalizes from scratch, as a Sinkformer does).
    chunked : bool, optional
        Evaluate the field block-wise (:mod:`sinkflow.particles`, memory O(n) per block). Default:
        automatically when one ``n x n`` matrix would exceed 512 MiB. Left at None on
        ``manifold="sphere"`` in ``d = 2, 3`` with SoftMax or Sinkhorn and identity matrices, the
        exact fast harmonic field (:func:`sinkflow.particles.harmonic_attention_field`, truncated to
        ``tol``) is used when cheaper (``Trajectory.harmonic_order``); ``False`` forces the dense field.
    landmarks : int, optional
        Approximate the attention with ``m`` landmarks in ``O(n m)`` per step
        (:mod:`sinkflow.particles`): Nyström for ``"sinkhorn"``, ``"softmax"``,
        ``"unnormalized"``, Skyformer's lifted Nyström for ``"gaussian"`` / ``"skyformer"``,
        segment means for ``"nystromformer"``. ``m >= n`` (``2n`` lifted) is exact. Needs a
        symmetric positive semi-definite ``W_Q^T W_K``.
    landmark_seed : int
        Seed of the landmark draw (done once: the approximate flow is an ODE of its own).
    landmark_sampling : {"farthest", "uniform"}
        Greedy farthest points of ``x0`` in the kernel's metric (cover the support: no particle
        far from every landmark) or uniform random particles
        (:func:`sinkflow.particles.landmark_indices`).
    tol, max_iter : float, int
        Sinkhorn stopping rule for ``n_iter=None``; ``tol`` defaults to :func:`default_tol`
        of the particles' dtype (1e-10 in float64, 1e-5 in float32).
    cluster_tol : float
        :math:`\delta` of the cluster monitor.
    progress : bool or None
        A tqdm progress bar, drawn only on a terminal or in a notebook (quiet in logs, pipes and
        CI): by default (None) once the run has taken 2 seconds, so short runs show nothing;
        True from the first step, False never.
    causal : bool
        Causal attention (Karagodin, Polyanskiy and Rigollet 2024): token ``i`` attends only to
        tokens ``j <= i`` (rows of ``x0`` in order), with any variant; Sinkhorn then targets the
        key marginals of uniform causal attention (docs/theory/causal.md). The first token moves
        by its own value, :math:`\dot x_0 = W_V x_0` (fixed on the sphere for ``W_V = I``).
        Evaluated densely (no ``chunked``, no ``landmarks``).
    norm : str or Placement, optional
        Where the residual layer normalizes (docs/theory/placements.md; Karagodin, Ge, Polyanskiy and
        Rigollet 2025): ``"post"`` :math:`x \leftarrow N(x + h A(x))`, ``"pre"`` :math:`x + h A(N(x))`,
        ``"peri"`` :math:`x + h N(A(N(x)))`, ``"mix"`` (Post-LN for the first quarter of the steps, then
        Pre-LN), ``"ngpt"`` :math:`N(x + h(N(A(x)) - x))`, ``"lnscale"`` (Pre-LN, layer ``l`` scaled by
        :math:`1/\sqrt{1 + l h}`) or ``"none"``; :func:`sinkflow.placement` sets ``N`` (unit sphere by
        default, RMSNorm, LayerNorm) and Mix-LN's split. With ``integrator="euler"`` each step is the
        practitioners' layer; with ``"rk4"`` the continuous model of the placement is integrated (for
        ``"post"`` exactly the flow of ``manifold="sphere"``). Leave ``manifold="euclidean"``; ``"post"``,
        ``"ngpt"`` and ``"mix"`` need ``N(x0) = x0``. None (default): the flow without placement, as before.

    Returns
    -------
    Trajectory
        Its ``evaluation`` says how the field was evaluated (dense, block-wise, landmarks, harmonic, or
        batched for an ensemble) and why: the path is chosen once per call, before the first step.

    Raises
    ------
    TypeError
        A numeric parameter that is not a real number (a string, a bool), or a count that is not
        an integer (``steps``, ``n_iter``, ``landmarks``, ...).
    ValueError
        Non-finite ``x0``, ``h <= 0``, ``steps < 0``, wrong shapes of the matrices or the
        weights, weights not summing to 1, points off the sphere, unknown options; batch
        dimensions that do not broadcast, or a non-positive temperature of some system (the
        message names the parameter).

    Notes
    -----
    Ensembles: leading dimensions of ``x0``, ``W_Q``, ``W_K``, ``W_V``, ``weights``,
    ``temperature`` and ``h`` broadcast together into a batch of independent systems; each
    evolves exactly as it would alone (float64: within 1e-12, iteration counts equal), its
    monitors, iteration counts and convergence reported per system (``Trajectory.positions`` of
    shape ``(T, ..., n, d)``). The dense attentions run as one batched flow (a Sinkhorn solve to
    tolerance stops each system when it converges), in chunks of systems when the batch would not
    fit the dense budget; landmarks, block-wise fields, registered attentions and gradients run
    system by system. One system of an ensemble is ``traj.system(i)``; :func:`sinkflow.animate`
    and :meth:`Trajectory.plot` draw its first systems on a grid.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> x0 = sinkflow.random_particles(8, 2, seed=0)
    >>> traj = sinkflow.simulate(x0, "sinkhorn", h=0.05, steps=10, monitors=["energy"])
    >>> traj.positions.shape, float(traj.times[-1])
    ((11, 8, 2), 0.5)
    >>> bool(np.all(np.diff(traj.monitors["energy"]) <= 0))   # F^inf decreases (W_V = W = I)
    True
    >>> x0 = np.stack([sinkflow.random_particles(8, 2, seed=s, manifold="sphere") for s in range(3)])
    >>> ens = sinkflow.simulate(x0, h=0.05, steps=10, manifold="sphere", temperature=[[0.5], [2.0]])
    >>> ens.positions.shape, ens.converged.shape        # 2 temperatures x 3 systems
    ((11, 2, 3, 8, 2), (2, 3))
    """
    check_numpy_float(x0, "x0")
    settings = checked_settings(
        integrator=integrator, manifold=manifold, n_iter=n_iter, tol=tol, max_iter=max_iter, warm_start=warm_start,
        chunked=chunked, landmarks=landmarks, landmark_seed=landmark_seed, landmark_sampling=landmark_sampling,
        causal=causal, monitors=monitors, monitor_every=monitor_every, save_every=save_every,
        cluster_tol=cluster_tol, progress=progress, norm=norm)
    steps = check_number(steps, "steps", integer=True, positive=True, allow_zero=True)
    variant = get_attention(attention)
    if is_ensemble(x0, W_Q, W_K, W_V, weights, temperature, h):
        return simulate_ensemble(x0, variant, W_Q, W_K, W_V, weights, temperature, h, steps, settings)
    X, numpy_out = leading(x0, "x0", W_Q, W_K, W_V, weights)
    _check_positions(X, manifold)
    Wq, Wk, Wv = (check_matrix(M, name, X.shape[1], X) for M, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
    tau = float(check_number(temperature, "temperature", positive=True))
    return run_system(X, variant, Wq, Wk, Wv, check_weights(weights, X), tau, h, steps, settings, numpy_out)
