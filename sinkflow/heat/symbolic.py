r"""Symbolic derivations behind the heat limit (sympy), used as test oracles and in notebooks.

Each function derives something from first principles and returns a
:class:`SymbolicCheck`: the sympy expressions involved, the residual that must vanish,
and a boolean ``holds`` (the residual simplifies to exactly 0). ``check.latex()``
renders the identity.

* :func:`heat_kernel_solves_heat`: :math:`\mathcal N(m, \Sigma_0 + 2tI)` solves
  :math:`\partial_t\rho = \Delta\rho` (d = 1, 2, 3).
* :func:`barenblatt_solves_porous_medium`: derives the exponents and constants of the
  Barenblatt profile for :math:`\partial_t\rho = \nabla\cdot(\rho\nabla\rho)` and its mass.
* :func:`sinkhorn_barycentric_map_gaussian`: solves the Schrödinger (Sinkhorn) equation
  for :math:`\rho = \mathcal N(0, s)` in 1D with kernel :math:`e^{-(x-y)^2/(2\varepsilon)}`,
  and expands :math:`(B_\varepsilon(x) - x)/(\varepsilon/2)` in :math:`\varepsilon`.
* :func:`softmax_barycentric_map_gaussian`: the same for SoftMax (Tweedie), scale
  :math:`\varepsilon`.
* :func:`sinkhorn_variance_rate_gaussian`: the exact mean-field variance rate of the
  Sinkhorn flow of a 1D Gaussian and its first-order correction (the O(eps) bias).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

from sinkflow._summary import Summarized

__all__ = [
    "SymbolicCheck", "heat_kernel_solves_heat", "barenblatt_solves_porous_medium",
    "sinkhorn_barycentric_map_gaussian", "softmax_barycentric_map_gaussian", "sinkhorn_variance_rate_gaussian",
]

x, y, t, eps, s = sp.symbols("x y t varepsilon s", positive=True)
X = sp.Symbol("x", real=True)


@dataclass(frozen=True, repr=False)
class SymbolicCheck(Summarized):
    """An identity derived with sympy.

    Its ``repr`` says whether the identity holds and shows it (shortened); in Jupyter the table
    comes with the identity typeset (:meth:`latex`).

    Attributes
    ----------
    name : str
    lhs, rhs : sympy expressions
        The two sides; ``holds`` means ``simplify(lhs - rhs) == 0``.
    residual : sympy expression
        ``lhs - rhs`` after simplification.
    holds : bool
    details : dict
        Derived intermediate quantities (exponents, constants, expansions).
    """

    name: str
    lhs: Any
    rhs: Any
    residual: Any
    holds: bool
    details: dict = field(default_factory=dict)

    def latex(self) -> str:
        """``lhs = rhs`` in LaTeX."""
        return f"{sp.latex(self.lhs)} = {sp.latex(self.rhs)}"

    def _repr_latex_(self) -> str:
        return f"$${self.latex()}$$"

    def _facts(self):
        def short(expr, width=90):
            text = str(expr)
            return text if len(text) <= width else text[:width - 3] + "..."

        facts = [[("identity", short(f"{self.lhs} = {self.rhs}"))],
                 [("residual", short(self.residual, 60))]]
        if self.details:
            facts[1].append(("details", short(", ".join(map(str, self.details)), 60)))
        return f"{self.name}: {'holds' if self.holds else 'does NOT hold'}", facts

    def _html_extra(self) -> str:
        return f"<div>{html.escape(self._repr_latex_())}</div>"


def _check(name, lhs, rhs, details=None) -> SymbolicCheck:
    residual = sp.simplify(sp.expand(lhs.doit() - rhs))
    return SymbolicCheck(name, lhs, rhs, residual, bool(residual == 0), details or {})


def heat_kernel_solves_heat(dim: int = 1) -> SymbolicCheck:
    r"""Check that :math:`\mathcal N(m, (\sigma^2 + 2t) I)` solves :math:`\partial_t\rho = \Delta\rho`.

    Examples
    --------
    >>> from sinkflow.heat.symbolic import heat_kernel_solves_heat
    >>> heat_kernel_solves_heat(2).holds
    True
    """
    if dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim}")
    sigma2 = sp.Symbol("sigma^2", positive=True)
    xs = sp.symbols(f"x1:{dim + 1}", real=True)
    ms = sp.symbols(f"m1:{dim + 1}", real=True)
    v = sigma2 + 2 * t
    squared = sum((xi - mi) ** 2 for xi, mi in zip(xs, ms, strict=True))
    rho = (2 * sp.pi * v) ** sp.Rational(-dim, 2) * sp.exp(-squared / (2 * v))
    lhs = sp.diff(rho, t)
    rhs = sum(sp.diff(rho, xi, 2) for xi in xs)
    res = sp.simplify((lhs - rhs) / rho)  # divide by the positive Gaussian: a polynomial identity
    return SymbolicCheck("heat kernel solves the heat equation", sp.Derivative(sp.Function("rho")(t, *xs), t),
                         sp.Symbol(r"\Delta\rho"), res, bool(res == 0), {"rho": rho})


def barenblatt_solves_porous_medium(dim: int = 1) -> SymbolicCheck:
    r"""Derive the Barenblatt solution of :math:`\partial_t\rho = \nabla\cdot(\rho\nabla\rho)` in dimension ``dim``.

    Ansatz :math:`\rho = t^{-\alpha}(A - k r^2 t^{-2\beta})` on its support. Matching powers
    of :math:`t` and :math:`r` gives :math:`\alpha = d/(d+2)`, :math:`\beta = \alpha/d`,
    :math:`k = 1/(2(d+2))`; the mass is
    :math:`M = \frac{2}{d+2}V_d (A/k)^{d/2} A` (integrated in radial coordinates).
    ``details`` holds ``alpha``, ``beta``, ``k``, ``mass`` (in terms of ``A``).

    Examples
    --------
    >>> from sinkflow.heat.symbolic import barenblatt_solves_porous_medium
    >>> c = barenblatt_solves_porous_medium(1)
    >>> c.holds, c.details["k"], c.details["alpha"]
    (True, 1/6, 1/3)
    """
    if dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim}")
    d = sp.Integer(dim)
    r = sp.Symbol("r", positive=True)
    A, k, alpha, beta = sp.symbols("A k alpha beta", positive=True)
    rho = t ** (-alpha) * (A - k * r ** 2 * t ** (-2 * beta))
    # radial divergence: div(rho grad rho) = r^(1-d) d/dr (r^(d-1) rho rho_r)
    pme = sp.diff(rho, t) - r ** (1 - d) * sp.diff(r ** (d - 1) * rho * sp.diff(rho, r), r)
    # Self-similarity: beta = alpha/d (mass conservation), alpha + 2 beta = 1 (time powers match).
    sol_ab = sp.solve([beta - alpha / d, alpha + 2 * beta - 1], [alpha, beta], dict=True)[0]
    expr = sp.expand(sp.simplify(pme.subs(sol_ab) * t ** 2))  # t^-2 is the common power
    poly = sp.Poly(expr, r)
    ksol = [kk for kk in sp.solve(poly.coeffs(), k, dict=True) if kk]
    k_val = ksol[0][k]
    residual = sp.simplify(expr.subs(k, k_val))
    R = sp.sqrt(A / k_val)
    surface = 2 * sp.pi ** (d / 2) / sp.gamma(d / 2)  # area of the unit sphere
    mass = sp.simplify(surface * sp.integrate((A - k_val * r ** 2) * r ** (d - 1), (r, 0, R)))
    vd = sp.pi ** (d / 2) / sp.gamma(d / 2 + 1)
    mass_formula = sp.Rational(2) / (d + 2) * vd * R ** d * A
    details = {"alpha": sol_ab[alpha], "beta": sol_ab[beta], "k": k_val, "mass": mass, "A": A,
               "mass_formula_ok": bool(sp.simplify(mass - mass_formula) == 0),
               "rho": rho.subs(sol_ab).subs(k, k_val)}
    lhs = sp.Derivative(sp.Function("rho")(t, r), t)
    rhs = sp.Symbol(r"\nabla\cdot(\rho\nabla\rho)")
    return SymbolicCheck(f"Barenblatt solves the porous-medium equation (d={dim})", lhs, rhs, residual,
                         bool(residual == 0) and details["mass_formula_ok"], details)


def _gaussian_moments(log_integrand, var):
    """For a log-quadratic integrand q(y) = -P y^2/2 + L y + c: (log int e^q dy, mean L/P, precision P).

    The completed square, sqrt(2 pi / P) exp(L^2/(2P) + c), valid for P > 0.
    """
    poly = sp.Poly(sp.expand(log_integrand), var)
    if poly.degree() != 2:
        raise ValueError("log-integrand must be quadratic in the integration variable")
    P = -2 * poly.coeff_monomial(var ** 2)
    L = poly.coeff_monomial(var)
    c = poly.coeff_monomial(1)
    log_integral = sp.log(2 * sp.pi / P) / 2 + L ** 2 / (2 * P) + c
    return sp.expand(log_integral), sp.simplify(L / P), sp.simplify(P)


def sinkhorn_barycentric_map_gaussian(order: int = 2) -> SymbolicCheck:
    r"""Sinkhorn barycentric map of :math:`\rho = \mathcal N(0, s)` for the kernel :math:`e^{-(x-y)^2/(2\varepsilon)}`.

    The symmetric Sinkhorn kernel :math:`k(x, y) = e^{\phi(x) + \phi(y) - (x-y)^2/(2\varepsilon)}`
    with :math:`\int k(x, y)\rho(y)dy = 1` for all :math:`x` has a quadratic potential
    :math:`\phi = c - a x^2/2`; the :math:`x^2` coefficient of the Schrödinger equation
    fixes :math:`a`. Then :math:`B(x) = \int k(x,y)\,y\,\rho(y)dy` is linear in :math:`x` and

    .. math::

        \frac{B_\varepsilon(x) - x}{\varepsilon/2} = -\frac{x}{s} + \frac{\varepsilon x}{4 s^2}
        + O(\varepsilon^2),

    whose leading term is the score :math:`\partial_x\log\rho = -x/s`. ``details`` holds
    ``a``, ``B`` (exact), ``series``.

    Examples
    --------
    >>> from sinkflow.heat.symbolic import sinkhorn_barycentric_map_gaussian
    >>> sinkhorn_barycentric_map_gaussian().holds
    True
    """
    a = sp.Symbol("a", real=True)
    log_rho_y = -y ** 2 / (2 * s)
    # Schroedinger equation: log int exp(-a y^2/2 - (X-y)^2/(2 eps)) rho(y) dy = a X^2/2 - c; compare X^2 terms
    logI, _, _ = _gaussian_moments(-a * y ** 2 / 2 - (X - y) ** 2 / (2 * eps) + log_rho_y, y)
    # phi(x) + log I(x) = 0 for all x: the X^2 coefficient of -a X^2/2 + log I must vanish
    eq = sp.expand(-a * X ** 2 / 2 + logI).coeff(X, 2)
    at = {s: 1, eps: sp.Rational(1, 10)}
    # of the two roots keep the one for which the kernel integrates (a + 1/eps + 1/s > 0)
    a_val = [sp.simplify(v) for v in sp.solve(eq, a) if sp.N((v + 1 / eps + 1 / s).subs(at)) > 0][0]
    _, B, _ = _gaussian_moments(-a_val * y ** 2 / 2 - (X - y) ** 2 / (2 * eps) + log_rho_y, y)
    rescaled = sp.simplify((B - X) / (eps / 2))
    series = sp.series(rescaled, eps, 0, order).removeO()
    score = -X / s
    details = {"a": a_val, "B": B, "series": sp.simplify(series), "first_order": sp.simplify(series.coeff(eps, 1))}
    return _check("Sinkhorn barycentric map: (B - x)/(eps/2) -> score", sp.Limit(rescaled, eps, 0), score, details)


def softmax_barycentric_map_gaussian(order: int = 2) -> SymbolicCheck:
    r"""SoftMax barycentric map of :math:`\mathcal N(0, s)` (Tweedie): :math:`(B - x)/\varepsilon \to` score.

    :math:`B(x) = \int y\, e^{-(x-y)^2/(2\varepsilon)}\rho(y)dy / \int e^{-(x-y)^2/(2\varepsilon)}\rho(y)dy
    = x + \varepsilon\,\partial_x\log(\rho * G_\varepsilon)(x) = x - \varepsilon x/(s + \varepsilon)`.
    The same layer scaled by :math:`\varepsilon/2` therefore doubles the score.

    Examples
    --------
    >>> from sinkflow.heat.symbolic import softmax_barycentric_map_gaussian
    >>> c = softmax_barycentric_map_gaussian()
    >>> c.holds, c.details["B"]
    (True, s*x/(s + varepsilon))
    """
    _, B, _ = _gaussian_moments(-(X - y) ** 2 / (2 * eps) - y ** 2 / (2 * s), y)
    rescaled = sp.simplify((B - X) / eps)
    series = sp.series(rescaled, eps, 0, order).removeO()
    # Tweedie: B - x = eps d/dx log(rho * G_eps); rho * G_eps = N(0, s + eps)
    tweedie = sp.simplify(eps * sp.diff(-X ** 2 / (2 * (s + eps)), X))
    details = {"B": B, "series": sp.simplify(series), "tweedie_ok": bool(sp.simplify(B - X - tweedie) == 0)}
    chk = _check("SoftMax barycentric map: (B - x)/eps -> score", sp.Limit(rescaled, eps, 0), -X / s, details)
    return SymbolicCheck(chk.name, chk.lhs, chk.rhs, chk.residual, chk.holds and details["tweedie_ok"], details)


def sinkhorn_variance_rate_gaussian(order: int = 2) -> SymbolicCheck:
    r"""Mean-field variance rate of the Sinkhorn flow for :math:`\mathcal N(0, s)` in 1D.

    With :math:`v = -(2/\varepsilon)(B(x) - x)` and :math:`B` linear (see
    :func:`sinkhorn_barycentric_map_gaussian`) the density stays Gaussian and
    :math:`\dot s = 2\,\mathbb E[x v(x)]`:

    .. math:: \dot s = \frac{8s}{2s + \varepsilon + \sqrt{\varepsilon^2 + 4s^2}}
              = 2 - \frac{\varepsilon}{2s} + O(\varepsilon^2),

    against :math:`\dot s = 2` for the heat equation: the bias is first order in
    :math:`\varepsilon`, with relative size :math:`\varepsilon/(4s)`.

    Examples
    --------
    >>> from sinkflow.heat.symbolic import sinkhorn_variance_rate_gaussian
    >>> c = sinkhorn_variance_rate_gaussian()
    >>> c.holds, c.details["series"]
    (True, 2 - varepsilon/(2*s))
    """
    B = sinkhorn_barycentric_map_gaussian().details["B"]
    slope = sp.simplify(B / X)
    rate = sp.simplify(2 * s * (-(2 / eps) * (slope - 1)))  # 2 E[x v] = 2 s (-(2/eps)(slope - 1))
    closed = 8 * s / (2 * s + eps + sp.sqrt(eps ** 2 + 4 * s ** 2))
    series = sp.series(rate, eps, 0, order).removeO()
    details = {"rate": rate, "closed_form": closed, "series": sp.simplify(series)}
    return _check("Sinkhorn mean-field variance rate", rate, closed, details)
