"""Inverses for Nyström approximations: the Moore-Penrose pseudo-inverse with a dtype-aware
cut-off, and the iterative (Newton-Schulz) inverse of Nyströmformer and Skyformer's code, with
its initializations.
"""

from __future__ import annotations

import math

import torch

from sinkflow._backend import (
    branch_free,
    check_finite,
    check_float,
    check_number,
    from_torch,
    require,
    storage_free,
    to_torch,
)

__all__ = ["iterative_inverse", "newton_schulz_pinv", "inverse_residual", "NystromWarning"]


class NystromWarning(UserWarning):
    """Issued when a Nyström method's iterative inverse has not converged to the asked ``tol``.

    Only when asked: the iterative inverses check themselves when given ``tol`` (one extra
    ``m x m`` product), never by default (Nyströmformer's 6 iterations leave the SoftMax landmark
    block of typical inputs nearly uninverted, so a default check would fire on every forward).
    """


_INVERSES = ("pinv", "iterative")


def _eye_like(a):
    return torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)


_SCALES = ("head", "batch")


def _check_scale(scale_over):
    if scale_over not in _SCALES:
        raise ValueError(f"init_scale must be one of {_SCALES}, got {scale_over!r}")
    return scale_over


def _start_scale(S, init="norms", scale_over="head"):
    """The ``c`` of the iteration's start :math:`Z_0 = S^T / c` (see :func:`_newton_schulz`)."""
    norm1, norm_inf = S.abs().sum(-2).amax(-1), S.abs().sum(-1).amax(-1)
    if scale_over == "batch":
        norm1, norm_inf = norm1.amax(), norm_inf.amax()
    return norm1 if init == "official" else norm1 * norm_inf


def _newton_schulz(S, n_iter, init="norms", scale_over="head"):
    r"""Cubic Newton–Schulz iteration :math:`Z \leftarrow \tfrac14 Z(13 I - SZ(15 I - SZ(7 I - SZ)))`.

    ``init="norms"`` starts at :math:`Z_0 = S^T / (\|S\|_1 \|S\|_\infty)`, which makes every
    eigenvalue of :math:`S Z_0` lie in (0, 1] for nonsingular ``S`` (Nyströmformer's start);
    ``init="official"`` at :math:`Z_0 = S^T / \|S\|_1` (Skyformer's start, for the scaled
    symmetric blocks of :func:`iterative_inverse`, whose spectrum lies in (0, 1]). The
    residual :math:`r = 1 - x` of each eigenvalue then maps to :math:`r^3 (3 + r) / 4`.
    ``scale_over="batch"`` takes each norm's maximum over every matrix of the batch at once
    (Nyströmformer's code) instead of per matrix.
    """
    return _products(S, _start_scale(S, init, scale_over), n_iter)


def _products(S, c, n_iter):
    """The iteration itself, ``4 n_iter`` matrix products from :math:`Z_0 = S^T / c`."""
    Z = S.transpose(-1, -2) / c[..., None, None]
    eye = _eye_like(S)
    for _ in range(n_iter):
        SZ = S @ Z
        Z = 0.25 * Z @ (13 * eye - SZ @ (15 * eye - SZ @ (7 * eye - SZ)))
    return Z


def _cubic(y):
    """The Newton-Schulz factor :math:`h(y) = 13 - 15y + 7y^2 - y^3` of one iteration, :math:`Z \\to Z h(SZ)/4`."""
    return 13 - y * (15 - y * (7 - y))


class _SpectralNewtonSchulz(torch.autograd.Function):
    r""":func:`_newton_schulz` of a symmetric ``S`` from :math:`Z_0 = S/c`, through the eigenvalues of ``S``.

    Every iterate is :math:`Z_t = S\,\varphi_t(S^2)` for the scalar recursion
    :math:`u_0 = 1/c`, :math:`u_{t+1} = u_t\, h(w u_t)/4` in :math:`w = \lambda^2`, so with
    :math:`S = U \Lambda U^T` (one ``eigh``), :math:`Z = U\, \Lambda \varphi(\Lambda^2)\, U^T`: the same
    matrix as the ``4 n_iter`` products of the iteration, in two.

    Backward is the derivative of the iteration itself (of :math:`A \mapsto A^T \varphi(AA^T)` at
    :math:`A = S`, with ``c`` an input of its own), in the eigenbasis:
    :math:`\partial S = U (H_s \circ \mathrm{sym}\,\hat G + H_a \circ \mathrm{skew}\,\hat G) U^T`,
    :math:`\hat G = U^T G U`, with :math:`2 H_s = \varphi_i + \varphi_j + (\lambda_i + \lambda_j)^2 P_{ij}`,
    :math:`2 H_a = -\varphi_i - \varphi_j - (\lambda_i - \lambda_j)^2 P_{ij}` and :math:`P_{ij}` the divided
    difference :math:`\varphi[\lambda_i^2, \lambda_j^2]`, carried through the recursion by the product
    rule (no division, exact for equal eigenvalues); :math:`\partial c = \sum_k \lambda_k\,
    \partial_c \varphi(\lambda_k^2)\, \hat G_{kk}`. Four products where autograd replays the
    ``8 n_iter`` of the iteration's graph.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(S, c, n_iter):
        lam, U = torch.linalg.eigh(S)
        w = lam * lam
        u = 1 / c[..., None].expand_as(lam)
        for _ in range(n_iter):
            u = 0.25 * u * _cubic(w * u)
        return (U * (lam * u)[..., None, :]) @ U.transpose(-1, -2), lam, U

    @staticmethod
    def setup_context(ctx, inputs, output):
        S, c, n_iter = inputs
        _, lam, U = output
        ctx.save_for_backward(S, c, lam, U)
        ctx.n_iter = n_iter
        ctx.mark_non_differentiable(lam, U)

    @staticmethod
    def backward(ctx, grad, _glam, _gU):
        S, c, lam, U = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph (a Hessian): the products' own graph, differentiable again
            with torch.enable_grad():
                return (*torch.autograd.grad(_products(S, c, ctx.n_iter), (S, c), grad, create_graph=True), None)
        w = lam * lam
        wi, wj = w[..., :, None], w[..., None, :]
        u = 1 / c[..., None].expand_as(lam)
        du = -u * u  # d u / d c
        P = torch.zeros_like(wi * wj)  # divided differences u[w_i, w_j]
        for _ in range(ctx.n_iter):
            y = w * u
            h, dh = _cubic(y), -15 + y * (14 - 3 * y)
            yi, yj = y[..., :, None], y[..., None, :]
            dy = u[..., None, :] + wi * P  # (w u)[w_i, w_j]
            h_dd = -15 + 7 * (yi + yj) - (yi * yi + yi * yj + yj * yj)  # h[y_i, y_j]
            P = 0.25 * (P * h[..., None, :] + u[..., :, None] * h_dd * dy)
            du = 0.25 * (du * h + u * dh * w * du)
            u = 0.25 * u * h
        Ut = U.transpose(-1, -2)
        G = Ut @ grad @ U
        sym, skew = (G + G.transpose(-1, -2)) / 2, (G - G.transpose(-1, -2)) / 2
        li, lj = lam[..., :, None], lam[..., None, :]
        phi = u[..., :, None] + u[..., None, :]
        H = (phi + (li + lj) ** 2 * P) * sym - (phi + (li - lj) ** 2 * P) * skew
        dS = U @ (0.5 * H) @ Ut
        dc = (lam * du * G.diagonal(dim1=-2, dim2=-1)).sum(-1)
        return dS, dc, None


def _residual(S, Z):
    """:math:`\\|I - S Z\\|_F` per matrix (one product)."""
    return torch.linalg.matrix_norm(_eye_like(S) - S @ Z)


def _suggested_iterations(rho: float, n_iter: int, tol: float) -> int | None:
    r"""Iterations after which the residual ``rho`` of ``n_iter`` iterations is guaranteed below ``tol``.

    One iteration maps :math:`E = I - SZ` to :math:`E^3 (3I + E)/4` exactly (a polynomial in
    :math:`E`), so :math:`\|E\|_F \mapsto \|E\|_F^3 (3 + \|E\|_F)/4` bounds the next residual
    (:math:`\|AB\|_F \le \|A\|_F \|B\|_2`). Only for ``rho < 1``; ``None`` otherwise (the norm then bounds nothing).
    """
    if not rho < 1:
        return None
    count = n_iter
    while rho > tol and count < n_iter + 64:
        rho, count = rho ** 3 * (3 + rho) / 4, count + 1
    return count


def _check_convergence(S, Z, n_iter: int, tol, what: str) -> None:
    """Warn (:class:`NystromWarning`) when the largest residual of ``n_iter`` iterations exceeds ``tol``.

    Nothing under torch.compile / torch.func (no data-dependent branch there) or without ``tol``.
    """
    if tol is None or branch_free() or storage_free(S) or S.numel() == 0:
        return
    wide = torch.promote_types(S.dtype, torch.float32)
    rho = float(_residual(S.detach().to(wide), Z.detach().to(wide)).amax())
    if rho <= tol:
        return
    from sinkflow._checks import warn_caller

    floor = S.shape[-1] * torch.finfo(S.dtype).eps  # rounding of Z's entries in S's dtype
    count = _suggested_iterations(rho, n_iter, tol)
    if tol < floor:
        advice = f"tol is below {S.dtype}'s rounding (about {floor:.1g}), which no iteration count reaches"
    elif count is not None:
        advice = f"n_iter = {count} guarantees it"
    elif math.isfinite(rho):
        advice = f"the residual is >= 1, so the norm bounds nothing: try n_iter >= {2 * max(n_iter, 1)} and check again"
    else:
        advice = "the iteration diverged (is the block positive, with spectrum in (0, 1] once scaled?)"

    warn_caller(f"{what} did not converge in n_iter = {n_iter} iterations: residual ||I - S Z||_F = {rho:.3g} > "
                f"tol = {tol:.3g}; {advice}", NystromWarning)


def _check_tol(tol):
    if tol is None:
        return None
    return float(check_number(tol, "tol", positive=True))


def _check_square(M, name="M"):
    numpy_out = not isinstance(M, torch.Tensor)
    a = to_torch(M, name)
    check_float(a, name)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{name} must be square (..., m, m), got {tuple(a.shape)}")
    check_finite(a.detach(), name)
    return a, numpy_out


def _check_iter(n_iter):
    return check_number(n_iter, "n_iter", integer=True, positive=True, allow_zero=True)


def _check_gamma(gamma):
    return float(check_number(gamma, "gamma", positive=True, allow_zero=True))


_INITS = ("official", "norms")


def _iterative_inverse(a, n_iter, gamma, init="official", tol=None):
    if init not in _INITS:
        raise ValueError(f"init must be one of {_INITS}, got {init!r}")
    r = a + gamma * _eye_like(a)
    d = r.sum(-1)
    require((d > 0).all(), ValueError,
            "iterative_inverse needs positive row sums of M + gamma I (a kernel block with gamma > 0)")
    s = d.rsqrt()
    S = s[..., :, None] * r * s[..., None, :]
    if _spectral(S):
        Z = _SpectralNewtonSchulz.apply(S, _start_scale(S, init), n_iter)[0]
    else:
        Z = _newton_schulz(S, n_iter, init)
    _check_convergence(S, Z, n_iter, tol, "iterative_inverse")
    return s[..., :, None] * Z * s[..., None, :]


def _spectral(S) -> bool:
    """Whether :class:`_SpectralNewtonSchulz` computes the iteration on ``S``: a symmetric block (to rounding)
    on the CPU, in eager mode (LAPACK's ``eigh`` of a small block costs a fraction of the products it replaces;
    a GPU's batched ``eigh`` does not, and a data-dependent branch would break a compiled graph or a
    ``torch.func`` transform)."""
    if S.device.type != "cpu" or branch_free() or S.shape[-1] < 2 or S.numel() == 0:
        return False
    scale = S.detach().abs().amax()
    return bool((S.detach() - S.detach().transpose(-1, -2)).abs().amax() <= 8 * torch.finfo(S.dtype).eps * scale)


def iterative_inverse(M, n_iter: int = 6, gamma: float = 0.1, init: str = "official", *, tol: float | None = None):
    r"""Skyformer's practical inverse: :math:`(M + \gamma I)^{-1}` by Newton–Schulz iterations.

    With :math:`R = M + \gamma I` and :math:`D = \mathrm{diag}(R \mathbf 1)`, the scaled matrix
    :math:`S = D^{-1/2} R D^{-1/2}` (spectrum in (0, 1] for a positive kernel block) is
    inverted by ``n_iter`` cubic Newton–Schulz iterations and scaled back,
    :math:`R^{-1} \approx D^{-1/2} S^{-1} D^{-1/2}`. Few iterations invert only the
    well-conditioned part of :math:`R`, which acts as extra regularization.

    Parameters
    ----------
    M : array (..., m, m)
        Symmetric landmark block with positive entries (e.g. :math:`\bar C_{J,J}`).
    n_iter : int
        Iterations (6 in Skyformer). ``n_iter -> inf`` gives :math:`(M + \gamma I)^{-1}`.
    gamma : float
        Ridge :math:`\gamma \ge 0` (0.1 in Skyformer).
    init : {"official", "norms"}
        Start of the iteration. ``"official"`` (default), as in Skyformer's code:
        :math:`Z_0 = S^T / \|S\|_1` (largest column sum; the official code takes that maximum
        over all heads and batch entries at once, here it is per head). ``"norms"``:
        :math:`Z_0 = S^T / (\|S\|_1 \|S\|_\infty)`, Nyströmformer's start, safe for any
        nonsingular matrix but slower. Measured on Gaussian landmark blocks (m = 64-128,
        p = 8-64, 6 iterations, gamma = 0.1), the relative spectral error to
        :math:`(M + \gamma I)^{-1}` was 0.35 (median) with ``"official"`` and 0.38 with
        ``"norms"``.
    tol : float, optional
        When given, check the iteration: one more ``m x m`` product gives the residual
        :math:`\|I - S Z_S\|_F` of the scaled block (:math:`Z_S = D^{1/2} Z D^{1/2}`; the same
        eigenvalues as :math:`I - (M + \gamma I) Z`), and a :class:`NystromWarning` names
        ``n_iter`` with a count that guarantees ``tol`` when the largest residual over the batch
        exceeds it. Skipped under ``torch.compile`` and ``torch.func`` transforms. Few
        iterations are Skyformer's regularization, so ``None`` (default) checks nothing.

    Notes
    -----
    On the CPU, for a symmetric ``M`` (to rounding), the iteration runs on the eigenvalues of
    :math:`S` (one ``eigh``; every iterate is a polynomial in :math:`S`): the same matrix to
    rounding as the ``4 n_iter`` matrix products, and its gradient is the iteration's own, in two
    products and two more backward. Elsewhere (a non-symmetric ``M``, a GPU, under
    ``torch.compile``) it takes the products.

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> M = np.array([[1.0, 0.2], [0.2, 1.0]])
    >>> Z = sinkflow.iterative_inverse(M, n_iter=10, gamma=0.0)
    >>> bool(np.allclose(Z, np.linalg.inv(M)))
    True
    """
    a, numpy_out = _check_square(M)
    if not (float(gamma) >= 0):
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    return from_torch(_iterative_inverse(a, _check_iter(n_iter), _check_gamma(gamma), init, _check_tol(tol)),
                      numpy_out)


def newton_schulz_pinv(M, n_iter: int = 6, *, tol: float | None = None):
    r"""Nyströmformer's iterative Moore–Penrose inverse of a (non-symmetric) block.

    Cubic Newton–Schulz iterations from :math:`Z_0 = M^T / (\|M\|_1 \|M\|_\infty)`;
    converges to :math:`M^{+}` (to :math:`M^{-1}` when ``M`` is nonsingular).

    ``tol``: when given, the residual :math:`\|I - M Z\|_F` (one more product; see
    :func:`inverse_residual`) is checked and a :class:`NystromWarning` names ``n_iter`` when its
    largest value over the batch exceeds ``tol`` (skipped under ``torch.compile`` and
    ``torch.func``). One iteration maps :math:`E = I - MZ` to :math:`E^3(3I + E)/4`, so from the
    start the worst eigenvalue's distance to 1 grows only about 3.25-fold per iteration: the
    SoftMax landmark blocks of Nyströmformer (condition numbers 1e4-1e7 on random inputs) are
    far from inverted after the paper's 6 (``docs/theory/nystrom.md``). A singular ``M`` keeps
    a residual of at least 1 (:math:`MM^{+}` is a projection).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> M = np.array([[0.7, 0.3], [0.4, 0.6]])
    >>> bool(np.allclose(sinkflow.newton_schulz_pinv(M, n_iter=12), np.linalg.inv(M)))
    True
    """
    a, numpy_out = _check_square(M)
    n_iter = _check_iter(n_iter)
    Z = _newton_schulz(a, n_iter)
    _check_convergence(a, Z, n_iter, _check_tol(tol), "newton_schulz_pinv")
    return from_torch(Z, numpy_out)


def inverse_residual(M, Z, gamma: float = 0.0):
    r"""The residual :math:`\|I - (M + \gamma I) Z\|_F` of an approximate inverse ``Z``, per matrix.

    One ``m x m`` product. Zero for the exact inverse; the Frobenius norm bounds the spectral
    one, and a residual below 1 shrinks as :math:`\rho \mapsto \rho^3 (3 + \rho)/4` with each
    further Newton–Schulz iteration.

    Parameters
    ----------
    M : array (..., m, m)
    Z : array (..., m, m)
        An approximate inverse of ``M + gamma I`` (e.g. :func:`newton_schulz_pinv` of ``M``, or
        :func:`iterative_inverse` of ``M`` with the same ``gamma``).
    gamma : float
        Ridge added to ``M``.

    Returns
    -------
    array (...)
        torch if ``M`` or ``Z`` is, numpy otherwise (computed in float32 at least, returned in
        float32 for half inputs).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> M = np.array([[1.0, 0.2], [0.2, 1.0]])
    >>> float(sinkflow.inverse_residual(M, sinkflow.newton_schulz_pinv(M, n_iter=10))) < 1e-12
    True
    """
    a, numpy_a = _check_square(M)
    z, numpy_z = _check_square(Z, "Z")
    if a.shape[-1] != z.shape[-1]:
        raise ValueError(f"Z must have M's size {a.shape[-1]}, got {tuple(z.shape)}")
    dtype = torch.promote_types(torch.promote_types(a.dtype, z.dtype), torch.float32)
    a, z = a.to(dtype), z.to(dtype)
    r = a + _check_gamma(gamma) * _eye_like(a)
    return from_torch(_residual(r, z), numpy_a and numpy_z)


def _pinv_rtol(dtype) -> float:
    """Default pseudo-inverse cutoff, sqrt(machine eps) relative to the largest eigenvalue.

    Kernel entries carry rounding ~ eps (the squared distance is an expansion), so landmark-block
    eigenvalues below ~sqrt(eps) are noise that 1/s amplifies: with LAPACK's m eps cutoff a
    float64 Nyström broke Cbar~ <= Cbar by 1e-5 relative; at sqrt(eps) the violation stays ~1e-8.
    """
    return math.sqrt(torch.finfo(dtype).eps)


def _core(block, inverse, n_iter, gamma, symmetric, init="official", tol=None):
    if inverse == "pinv":
        return torch.linalg.pinv(block, hermitian=symmetric, rtol=_pinv_rtol(block.dtype))
    if symmetric:
        return _iterative_inverse(block, n_iter, gamma, init, tol)
    Z = _newton_schulz(block, n_iter)
    _check_convergence(block, Z, n_iter, tol, "the Nyström inverse")
    return Z


def _check_inverse(inverse):
    if inverse not in _INVERSES:
        raise ValueError(f"inverse must be one of {_INVERSES}, got {inverse!r}")
