r"""The limit geometry of unnormalized self-attention in :math:`\mathbb{R}^d` with a general value matrix.

Geshkovski, Letrouit, Polyanskiy and Rigollet, *The emergence of clusters in self-attention dynamics*
(NeurIPS 2023, arXiv:2305.05465) study :math:`\dot x_i = \sum_j P_{ij}(t) V x_j` with
:math:`P_{ij} = \mathrm{softmax}_j \langle Q x_i, K x_j\rangle` (:func:`sinkflow.simulate` with
``attention="softmax"``, ``W_Q=Q``, ``W_K=K``, ``W_V=V``, Euclidean, no normalization) and read the limit off
the rescaled tokens :math:`z_i(t) = e^{-tV} x_i(t)` (:meth:`sinkflow.Trajectory.rescaled`): the
spectrum of :math:`V` decides whether the :math:`z_i` end on the vertices of a convex polytope
(:math:`V = I_d`), on at most three parallel hyperplanes (a simple positive top eigenvalue), or on a
polytope times a subspace (a repeated top eigenvalue). :func:`limit_geometry` classifies an end state
and says which theorem's hypotheses the matrices meet (docs/theory/value_geometry.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sinkflow._backend import check_number
from sinkflow._summary import Summarized, as_numpy, number

__all__ = ["LimitGeometry", "limit_geometry", "GEOMETRY_KINDS"]

#: What :func:`limit_geometry` can report.
GEOMETRY_KINDS = ("polytope vertices", "hyperplanes", "polytope x subspace", "undetermined")


@dataclass(frozen=True, repr=False)
class LimitGeometry(Summarized):
    """Result of :func:`limit_geometry`.

    Attributes
    ----------
    kind : str
        One of :data:`GEOMETRY_KINDS`.
    count : int
        Vertices of the polytope (``"polytope vertices"``, ``"polytope x subspace"``: vertices of the
        projection on the top eigenspace) or hyperplanes (``"hyperplanes"``); for ``"undetermined"``,
        the number of distinct points (or levels) found.
    labels : numpy.ndarray (n,) of int
        The vertex or hyperplane of each token (numbered in order of first appearance).
    levels : numpy.ndarray (count,) or None
        Hyperplanes: the coordinate of each along :math:`\\varphi_1` (increasing; the hyperplanes are
        :math:`\\{z : \\psi_1^T z = \\text{level}\\,\\psi_1^T\\varphi_1\\}`, :math:`\\psi_1` the left
        eigenvector, orthogonal to :math:`\\varphi_1` when ``V`` is symmetric).
    vertices : numpy.ndarray (count, k) or None
        Polytope kinds: the vertices, in coordinates of the top eigenspace (``k = d`` for ``V = c I``).
    direction : numpy.ndarray (d,)
        :math:`\\varphi_1`, the unit top eigenvector (the first basis vector of the top eigenspace).
    multiplicity : int
        Multiplicity of the top eigenvalue of ``V``.
    theorem : str
        The result of the paper the matrices point to (``"Theorem 3.1"``, ``"Theorem 4.1"``,
        ``"Theorem 5.1"``, ``"Theorem 2.1"`` in :math:`d = 1`) or ``"none"``.
    hypotheses : bool or None
        Whether ``V`` and ``W`` meet that theorem's hypotheses as sinkflow checks them (None without ``W``).
    reason : str
        Why the kind was chosen, or why it is undetermined.
    tol : float
        Distance under which points count as one, relative to :math:`\\max_i \\|z_i\\|`.
    """

    kind: str
    count: int
    labels: np.ndarray
    levels: np.ndarray | None
    vertices: np.ndarray | None
    direction: np.ndarray
    multiplicity: int
    theorem: str
    hypotheses: bool | None
    reason: str
    tol: float

    def _facts(self):
        what = {"polytope vertices": "vertices of a convex polytope", "hyperplanes": "parallel hyperplanes",
                "polytope x subspace": "vertices of a polytope x a subspace"}.get(self.kind, "undetermined")
        head = f"{self.count} {what}" if self.kind != "undetermined" else f"undetermined ({self.count} distinct)"
        hyp = "not checked (no W)" if self.hypotheses is None else ("met" if self.hypotheses else "NOT met")
        lines = [[("theorem", self.theorem), ("hypotheses", hyp), ("top multiplicity", str(self.multiplicity)),
                  ("tol", number(self.tol))]]
        if self.levels is not None:
            lines.append([("levels along phi_1", ", ".join(number(v) for v in self.levels[:5]))])
        lines.append([("reason", self.reason)])
        return head, lines


def _matrix(M, name: str, d: int) -> np.ndarray:
    A = np.asarray(as_numpy(M), dtype=float)
    if A.shape != (d, d):
        raise ValueError(f"{name} must be a (d, d) = ({d}, {d}) matrix, got shape {A.shape}")
    if not np.isfinite(A).all():
        raise ValueError(f"{name} must be finite")
    return A


def _groups(points: np.ndarray, radius: float) -> np.ndarray:
    """Labels of single-linkage groups of ``points`` (m, k) at distance ``radius`` (first appearance order)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    if len(points) == 1:
        return np.zeros(1, dtype=int)
    raw = fcluster(linkage(points, "single"), t=radius, criterion="distance")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[inverse].astype(int)


def _all_vertices(centers: np.ndarray, radius: float) -> tuple[bool, int]:
    """Whether every point of ``centers`` is a vertex of their convex hull, and how many vertices it has."""
    from scipy.spatial import ConvexHull

    m = len(centers)
    if m <= 1:
        return True, m
    shifted = centers - centers.mean(0)
    _, s, vt = np.linalg.svd(shifted, full_matrices=False)
    r = int((s > radius).sum())  # the dimension of the affine span, at the resolution of the clustering
    coords = shifted @ vt[:r].T
    if r == 0:
        return m == 1, 1
    if r == 1:
        return m == 2, 2
    hull = ConvexHull(coords)
    return len(hull.vertices) == m, len(hull.vertices)


def _spectrum(V: np.ndarray, tol: float):
    """Top eigenvalue, its multiplicity (eigenvalues within ``tol`` of it), whether it is semisimple,
    a basis of its eigenspace (columns) and the coordinates map onto it (rows, ``coords @ z``)."""
    symmetric = np.allclose(V, V.T, atol=1e-12 * max(1.0, np.abs(V).max()))
    if symmetric:
        lam, U = np.linalg.eigh(V)
        order = np.argsort(-lam)
        lam, U = lam[order], U[:, order]
        top = np.abs(lam - lam[0]) <= tol * max(1.0, abs(lam[0]))
        return complex(lam[0]), int(top.sum()), True, U[:, top], U[:, top].T, lam
    lam, U = np.linalg.eig(V)
    order = np.argsort(-lam.real)
    lam, U = lam[order], U[:, order]
    top = np.abs(lam - lam[0]) <= tol * max(1.0, abs(lam[0]))
    k = int(top.sum())
    d = V.shape[0]
    semisimple = np.linalg.matrix_rank(V - lam[0].real * np.eye(d), tol=1e-8 * max(1.0, np.abs(V).max())) == d - k
    if abs(lam[0].imag) > 1e-12 or not semisimple or np.linalg.cond(U) > 1e10:
        return lam[0], k, False, U[:, top].real, None, lam
    coords = np.linalg.inv(U)[top].real
    basis = U[:, top].real
    scale = np.linalg.norm(basis, axis=0)
    return complex(lam[0]), k, True, basis / scale, coords * scale[:, None], lam


def _hypotheses(V, W, lam0, k, d, phi, lam):
    """(theorem, met or None) for the paper's results as sinkflow checks them (docs/theory/value_geometry.md)."""
    Wsym = None if W is None else (W + W.T) / 2
    pd = None if W is None else bool(np.linalg.eigvalsh(Wsym).min() > 0)
    if d == 1:
        return "Theorem 2.1", None if W is None else bool(V[0, 0] > 0 and W[0, 0] > 0)
    if k == d:
        iso = bool(np.allclose(V, lam0.real * np.eye(d)) and lam0.real > 0)
        return "Theorem 3.1", None if W is None else bool(iso and pd)
    if k == 1:
        others = lam[1:]
        simple_top = bool(lam0.real > 0 and abs(lam0.imag) < 1e-12 and np.all(others.real < lam0.real))
        return "Theorem 4.1", None if W is None else bool(simple_top and float(phi @ W @ phi) > 0)
    return "Theorem 5.1", None if W is None else bool(lam0.real > 0 and pd)


def limit_geometry(z, V=None, *, W=None, tol: float = 1e-2) -> LimitGeometry:
    r"""Classify the rescaled end state of a self-attention flow with value matrix ``V``.

    Points closer than ``tol * max_i |z_i|`` count as one. With :math:`\lambda_1` the eigenvalue of
    ``V`` of largest real part and :math:`k` its multiplicity:

    - :math:`k = d \ge 2` (``V = c I``, :math:`c > 0`): ``"polytope vertices"`` when every distinct
      point is a vertex of the convex hull of the distinct points (Theorem 3.1 of Geshkovski et al.);
    - :math:`k = 1` (simple, real, positive; also :math:`d = 1`): ``"hyperplanes"`` when the coordinates
      along the eigenvector :math:`\varphi_1` take at most three values (Theorem 4.1; Theorem 2.1
      in :math:`d = 1`, where the hyperplanes are points);
    - :math:`1 < k < d` (semisimple): ``"polytope x subspace"`` when the projections on the top
      eigenspace are vertices of their hull (Theorem 5.1);
    - anything else (points inside the hull, more than three levels, :math:`\lambda_1 \le 0`, a complex
      or defective top eigenvalue): ``"undetermined"``, with the reason.

    Parameters
    ----------
    z : array (n, d) or torch.Tensor
        The rescaled end state :math:`z_i(T) = e^{-TV} x_i(T)` (``traj.rescaled(V)[-1]``).
    V : array (d, d), optional
        The value matrix (identity by default).
    W : array (d, d), optional
        :math:`Q^T K` (``W_Q.T @ W_K`` of :func:`sinkflow.simulate`): when given, ``hypotheses`` says
        whether the theorem's sign conditions hold (:math:`Q^T K` positive definite, or
        :math:`\langle Q\varphi_1, K\varphi_1\rangle > 0` for Theorem 4.1, :math:`QK > 0` in :math:`d = 1`).
    tol : float
        Relative merging distance, in (0, 1).

    Returns
    -------
    LimitGeometry

    Raises
    ------
    ValueError
        ``z`` is not a finite ``(n, d)`` array with ``n >= 1``, ``V`` or ``W`` is not a finite
        ``(d, d)`` matrix, or ``tol`` is outside (0, 1).

    Examples
    --------
    >>> import numpy as np, sinkflow
    >>> square = np.array([[1.0, 1], [1, -1], [-1, 1], [-1, -1], [1, 1]])
    >>> sinkflow.limit_geometry(square).kind, sinkflow.limit_geometry(square).count
    ('polytope vertices', 4)
    >>> g = sinkflow.limit_geometry(np.array([[0.5, 2.0], [0.5, -1.0], [-0.3, 0.0]]), np.diag([1.0, -0.5]))
    >>> g.kind, g.count, g.levels.tolist()
    ('hyperplanes', 2, [-0.3, 0.5])
    """
    tol = check_number(tol, "tol", positive=True)
    if tol >= 1:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    Z = np.asarray(as_numpy(z), dtype=float)
    if Z.ndim != 2 or Z.shape[0] < 1 or Z.shape[1] < 1:
        raise ValueError(f"z must be an (n, d) array with n >= 1, got shape {Z.shape}")
    if not np.isfinite(Z).all():
        raise ValueError("z must be finite (rescale with the V the flow ran with; see Trajectory.rescaled)")
    n, d = Z.shape
    V = np.eye(d) if V is None else _matrix(V, "V", d)
    W = None if W is None else _matrix(W, "W", d)
    radius = tol * max(float(np.linalg.norm(Z, axis=1).max()), np.finfo(float).tiny)
    lam0, k, ok, basis, coords, lam = _spectrum(V, 1e-9)
    phi = basis[:, 0] / np.linalg.norm(basis[:, 0])
    theorem, hyp = _hypotheses(V, W, lam0, k, d, phi, lam)

    def result(kind, count, labels, reason, levels=None, vertices=None, theorem=theorem, hyp=hyp):
        return LimitGeometry(kind, int(count), labels, levels, vertices, phi, k, theorem, hyp, reason, tol)

    if not ok or lam0.real <= 0:
        labels = _groups(Z, radius)
        why = ("the top eigenvalue is not positive" if ok else "the top eigenvalue is complex or defective")
        return result("undetermined", labels.max() + 1, labels, f"{why} (lambda_1 = {lam0:.4g}): no theorem applies",
                      theorem="none", hyp=None)
    C = Z @ coords.T  # (n, k): coordinates in the top eigenspace
    labels = _groups(C, radius)
    m = int(labels.max()) + 1
    centers = np.stack([C[labels == c].mean(0) for c in range(m)])
    if k == 1:
        order = np.argsort(centers[:, 0])
        relabel = np.empty(m, dtype=int)
        relabel[order] = np.arange(m)
        labels, levels = relabel[labels], centers[order, 0]
        if m <= 3:
            return result("hyperplanes", m, labels, f"{m} level(s) along phi_1 (at most 3)", levels=levels)
        return result("undetermined", m, labels, f"{m} levels along phi_1, more than 3", levels=levels)
    vertex_ok, nv = _all_vertices(centers, radius)
    kind = "polytope vertices" if k == d else "polytope x subspace"
    if vertex_ok:
        where = "" if k == d else f" of the {k}-dimensional top eigenspace"
        return result(kind, m, labels, f"all {m} distinct points{where} are vertices of their hull", vertices=centers)
    return result("undetermined", m, labels, f"{m - nv} of {m} distinct points are not vertices of their hull",
                  vertices=centers)
