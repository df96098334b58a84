"""The theory pages state what the code does: their machine-readable tables are checked here.

``docs/theory/heat_limit.md`` holds one row per normalization: the clock of its limit
equation and the exact mean-field variance rate of a 1D Gaussian under the layer. Oracles:
sympy (the derivations of :mod:`sinkflow.heat.symbolic`, limits, integrals) and the particle
velocity of the code on a deterministic Gaussian sample.
"""

from pathlib import Path

import numpy as np
import pytest
import sympy as sp
from scipy.stats import norm

import sinkflow
from sinkflow.heat import symbolic
from sinkflow.heat._heat_velocity import NORMALIZATIONS
from sinkflow.heat._limits import limit_time_factor

DOCS = Path(__file__).parents[1] / "docs" / "theory"
s, eps, x = sp.symbols("s varepsilon x", positive=True)


def read_table(page, marker):
    """Rows (dicts keyed by the header) of the Markdown table following ``<!-- marker``."""
    text = (DOCS / page).read_text()
    lines = text[text.index(f"<!-- {marker}"):].splitlines()[1:]
    table = [line for line in lines[: next(i for i, row in enumerate(lines) if not row.startswith("|"))]]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in table[2:]]
    return [dict(zip(header, row, strict=True)) for row in rows]


HEAT_ROWS = {row["normalization"]: row for row in read_table("heat_limit.md", "heat-limits")}


def page_rate(name):
    return sp.sympify(HEAT_ROWS[name]["variance rate of $\\mathcal N(0, s)$"], locals={"s": s, "eps": eps})


def page_clock(name):
    clock = HEAT_ROWS[name]["clock"]
    return None if clock == "none" else float(clock)


def test_heat_page_has_one_row_per_normalization():
    assert sorted(HEAT_ROWS) == sorted(NORMALIZATIONS)


@pytest.mark.parametrize("name", NORMALIZATIONS)
def test_heat_page_clock_is_the_code_clock(name):
    assert page_clock(name) == limit_time_factor(name)


def gaussian_quantiles(n, var):
    """A deterministic sample of N(0, var): the (i - 1/2)/n quantiles, rescaled to variance ``var``."""
    q = norm.ppf((np.arange(n) + 0.5) / n)
    return (q * np.sqrt(var / np.mean(q ** 2)))[:, None]


# SoftMax-dot tilts the sample's weights by exp(xy/eps): with var/eps above ~1/2 the tilted
# mean leaves the range of 800 points (12% off at var/eps = 0.8), so it is checked below 1/2.
RATE_POINTS = [(name, var, bandwidth) for name in NORMALIZATIONS
               for var, bandwidth in ([(0.5, 1.0), (0.3, 1.0)] if name == "softmax_dot" else [(1.0, 0.3), (1.0, 1.5)])]


@pytest.mark.parametrize("name, var, bandwidth", RATE_POINTS)
def test_heat_page_variance_rate_is_the_code_velocity(name, var, bandwidth):
    pts = gaussian_quantiles(800, var)
    v = sinkflow.heat_velocity(pts, bandwidth, name, tol=1e-11)
    measured = 2 * np.mean(pts * v)  # d/dt E[x^2] = 2 E[x v(x)]
    stated = float(page_rate(name).subs({s: var, eps: bandwidth}))
    assert measured == pytest.approx(stated, rel=0.03)


@pytest.mark.parametrize("name, derivation", [("sinkhorn", symbolic.sinkhorn_barycentric_map_gaussian),
                                              ("softmax_gaussian", symbolic.softmax_barycentric_map_gaussian)])
def test_heat_page_rate_follows_from_the_sympy_barycentric_map(name, derivation):
    sym_s, sym_eps, sym_x = symbolic.s, symbolic.eps, symbolic.X
    B = derivation().details["B"].subs({sym_s: s, sym_eps: eps, sym_x: x})
    rate = 2 * s * (-(2 / eps)) * (sp.simplify(B / x) - 1)  # v = -(2/eps)(B - x), linear in x
    assert sp.simplify(rate - page_rate(name)) == 0


@pytest.mark.parametrize("name", ["sinkhorn", "softmax_gaussian", "unnormalized"])
def test_heat_page_rate_tends_to_its_limit_equation(name):
    clock = sp.nsimplify(page_clock(name))
    rho = sp.exp(-x ** 2 / (2 * s)) / sp.sqrt(2 * sp.pi * s)
    equation = HEAT_ROWS[name]["limit equation"]
    # heat: d/dt E[x^2] = c int x^2 rho'' = 2c; porous medium: = -2c int x rho rho' = c int rho^2
    expected = {"heat": 2 * clock, "porous_medium": clock * sp.integrate(rho ** 2, (x, -sp.oo, sp.oo))}[equation]
    assert sp.simplify(sp.limit(page_rate(name), eps, 0) - expected) == 0


def test_heat_page_softmax_dot_contracts_to_size_sqrt_eps():
    rate = page_rate("softmax_dot")
    assert sp.limit(rate.subs(s, 1), eps, 0) == -sp.oo  # no limit: the velocity blows up
    assert sp.solve(rate, s) == [eps]  # the mean-field fixed point S = eps
    assert rate.subs(s, 2 * eps) < 0 < rate.subs(s, eps / 2)  # and it attracts


def test_nystrom_proof_step_with_repeated_landmarks():
    """The Loewner bound of the iterative inverse holds through B_J^T Z B_J <= I, not via M^+."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    Cbar = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1) / 2)  # PSD Gaussian kernel, numpy oracle
    J = np.array([0, 1, 2, 2, 5, 5, 7])  # repeated landmarks: M is singular
    M, gamma = Cbar[np.ix_(J, J)], 0.1
    ridge_inverse = np.linalg.inv(M + gamma * np.eye(len(J)))
    # the false step: (M + gamma I)^-1 <= M^+ fails on the null space of M
    assert np.linalg.eigvalsh(np.linalg.pinv(M, hermitian=True) - ridge_inverse).min() < -1
    for n_iter in (2, 6, 30):
        Z = sinkflow.iterative_inverse(M, n_iter=n_iter, gamma=gamma)
        assert np.linalg.eigvalsh(Z).min() > -1e-10
        assert np.linalg.eigvalsh(ridge_inverse - Z).min() > -1e-8  # 0 <= Z <= (M + gamma I)^-1
        approx = Cbar[:, J] @ Z @ Cbar[J, :]
        assert np.linalg.eigvalsh(Cbar - approx).min() > -1e-8  # the conclusion: Cbar~ <= Cbar


ENERGY_ROWS = read_table("gradient_flows.md", "energy-signs")


@pytest.mark.parametrize("row", ENERGY_ROWS, ids=lambda r: f"{r['attention']}{r['values $W_V$']}")
def test_gradient_flow_page_sign_convention_is_the_simulator(row):
    rng = np.random.default_rng(1)
    A = rng.normal(size=(2, 2))
    W = A @ A.T / 4 + 0.1 * np.eye(2)  # symmetric positive definite
    sign = {"+W": 1.0, "-W": -1.0}[row["values $W_V$"]]
    x0 = sinkflow.random_particles(20, 2, seed=0)
    traj = sinkflow.simulate(x0, row["attention"], W_Q=np.eye(2), W_K=W, W_V=sign * W, h=0.01, steps=8,
                             monitors=["energy"])
    steps = np.diff(traj.monitors["energy"])
    expected = {"decreases": -1, "increases": 1}[row["along the flow"]]
    assert np.all(np.sign(steps) == expected), steps


def test_nystrom_page_constants_are_the_code_constants():
    import sinkflow.bounds as bounds

    t = sp.Rational(1, 2)
    # m >= c R log(2N/delta) from P(|Y - P| >= t) <= 2N exp(-m t^2 / (2R(1 + t/3)))
    bernstein = 2 * (1 + t / 3) / t ** 2
    rows = {row["in sinkflow"]: sp.Rational(row["value"]) for row in read_table("nystrom.md", "nystrom-constants")}
    assert rows == {"LANDMARK_CONSTANT": 2 * bernstein, "SHARP_LANDMARK_CONSTANT": bernstein}
    for name, value in rows.items():
        assert getattr(bounds, name) == pytest.approx(float(value), rel=1e-12)


CIRCLE_ROWS = {row["normalization"]: row for row in read_table("mean_field.md", "circle-rates")}
k_sym, beta_sym = sp.symbols("k beta", positive=True)


def test_mean_field_page_has_one_circle_row_per_normalization():
    from sinkflow.heat import CIRCLE_NORMALIZATIONS

    assert sorted(CIRCLE_ROWS) == sorted(CIRCLE_NORMALIZATIONS)


@pytest.mark.parametrize("name", ["softmax", "unnormalized", "sinkhorn"])
def test_mean_field_page_circle_rate_is_the_code_rate(name):
    rate = sp.sympify(CIRCLE_ROWS[name]["growth rate of $\\cos k\\theta$"], locals={"k": k_sym, "beta": beta_sym})
    for k in (1, 2, 3, 7):
        for beta in (0.5, 5.0, 20.0):
            stated = float(rate.subs({k_sym: k, beta_sym: beta}).evalf(30))
            assert sinkflow.circle_growth_rate(k, beta, name) == pytest.approx(stated, rel=1e-10)
    assert int(CIRCLE_ROWS[name]["$k^*$ at $\\beta = 5$"]) == sinkflow.fastest_mode(5.0, name)


def test_mean_field_page_bessel_step_of_the_derivation():
    """J_k = int e^{beta cos} sin sin(k .) = pi (I_{k-1} - I_{k+1}) = 2 pi k I_k / beta (sympy, 30 digits)."""
    psi = sp.Symbol("psi")
    for m in (1, 2, 5):
        for b in (sp.Rational(3, 10), sp.Integer(4)):
            J = sp.Integral(sp.exp(b * sp.cos(psi)) * sp.sin(psi) * sp.sin(m * psi), (psi, 0, 2 * sp.pi)).evalf(30)
            assert abs(J - (sp.pi * (sp.besseli(m - 1, b) - sp.besseli(m + 1, b))).evalf(30)) < 1e-20
            assert abs(J - (2 * sp.pi * m * sp.besseli(m, b) / b).evalf(30)) < 1e-20


def test_mean_field_page_step_constants_are_the_code_constants():
    import sinkflow.heat._mean_field as mf
    import sinkflow.heat._remap as remap

    rows = {row["constant"].strip("`"): float(row["value"]) for row in read_table("mean_field.md", "mean-field-steps")}
    assert sorted(rows) == ["ACCURACY", "CFL", "LOCAL_TOL", "MAX_STRETCH"]
    for name, value in rows.items():
        assert getattr(mf if name == "CFL" else remap, name) == value
