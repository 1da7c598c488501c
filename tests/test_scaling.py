"""lecture_pkg.scaling against independent references: synthetic data from known laws, the
closed-form vertex of a parabola, a brute-force minimisation at fixed compute, finite
differences, and the recorded sweep's own figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import check_grad, minimize_scalar

from lecture_pkg.scaling import (
    ParametricLaw,
    PowerLaw,
    _objective,
    fit_approach2,
    fit_approach3,
    fit_power_law,
    huber,
    isoflop_minimum,
    load_sweep,
)

# Hoffmann et al. (2022), equation (10): their approach-3 fit
CHINCHILLA = ParametricLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)


def isoflop_grid(budgets: list[float], per_budget: int = 5) -> tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """(n, d, budget), each (runs,): sizes spread over a factor 30 around each budget's
    Chinchilla optimum."""
    ns, ds, cs = [], [], []
    for c in budgets:
        centre = CHINCHILLA.optimal(c)[0]
        for n in centre * np.geomspace(1 / 6, 6, per_budget):
            ns.append(n)
            ds.append(c / (6 * n))
            cs.append(c)
    return np.array(ns), np.array(ds), np.array(cs)


def test_approach3_recovers_a_known_law() -> None:
    n, d, _ = isoflop_grid([1e18, 1e19, 1e20, 1e21])
    fit = fit_approach3(n, d, CHINCHILLA(n, d))
    for name in ("E", "A", "B", "alpha", "beta"):
        assert getattr(fit, name) == pytest.approx(getattr(CHINCHILLA, name), rel=2e-3), name


def test_approach3_with_noise_stays_close() -> None:
    n, d, _ = isoflop_grid([1e18, 1e19, 1e20, 1e21])
    noise = np.random.default_rng(0).normal(0, 0.002, len(n))
    fit = fit_approach3(n, d, CHINCHILLA(n, d) * np.exp(noise))
    assert fit.a == pytest.approx(CHINCHILLA.a, abs=0.05)
    assert fit.predict(1e9, 2e10) == pytest.approx(CHINCHILLA.predict(1e9, 2e10), rel=0.01)


def test_chinchilla_exponents_as_published() -> None:
    # the paper's table 2: approach 3 gives a = 0.46, b = 0.54 (from these rounded parameters)
    assert CHINCHILLA.a == pytest.approx(0.46, abs=0.01)
    assert CHINCHILLA.b == pytest.approx(0.54, abs=0.01)
    assert CHINCHILLA.a + CHINCHILLA.b == pytest.approx(1.0)


@pytest.mark.parametrize("flops", [1e15, 5.76e23, 1e26])
def test_closed_form_optimum_matches_brute_force(flops: float) -> None:
    law = ParametricLaw(E=1.2, A=23.0, B=2.4e6, alpha=0.37, beta=1.03)
    for candidate in (law, CHINCHILLA):
        result = minimize_scalar(lambda x: candidate(math.exp(x), flops / (6 * math.exp(x))),
                                 bounds=(0, 80), method="bounded",
                                 options={"xatol": 1e-10})
        n_opt, d_opt = candidate.optimal(flops)
        assert float(n_opt) == pytest.approx(math.exp(result.x), rel=1e-5)
        assert float(n_opt * d_opt) == pytest.approx(flops / 6, rel=1e-12)
        assert candidate.tokens_per_parameter(flops) == pytest.approx(float(d_opt / n_opt))


def test_approach2_recovers_known_power_laws() -> None:
    budgets = np.array([1e18, 1e19, 1e20, 1e21])
    n, loss, cs = [], [], []
    for c in budgets:
        n_opt = 0.09 * c**0.5
        for x in np.linspace(-1.5, 1.5, 5):
            n.append(n_opt * math.exp(x))
            loss.append(30 * c**-0.05 + 0.1 * x**2)
            cs.append(c)
    fit = fit_approach2(n, loss, cs)
    assert fit.n_law.exponent == pytest.approx(0.5, abs=1e-9)
    assert fit.n_law.coefficient == pytest.approx(0.09, rel=1e-7)
    assert fit.d_law.exponent == pytest.approx(0.5, abs=1e-9)
    assert fit.loss_law.exponent == pytest.approx(-0.05, abs=1e-9)
    assert fit.curvature == pytest.approx(0.1, rel=1e-9)
    assert fit.predict(0.09 * 1e22**0.5 * math.e, 1e22) == pytest.approx(
        30 * 1e22**-0.05 + 0.1, rel=1e-9)


def test_parabola_vertex_three_points_closed_form() -> None:
    x = np.log([1e5, 3e5, 2e6])
    y = np.array([1.6, 1.45, 1.55])
    m = isoflop_minimum(np.exp(x), y, budget=1e14)
    # vertex of the parabola through three points (Lagrange form)
    num = (x[1] - x[0]) ** 2 * (y[1] - y[2]) - (x[1] - x[2]) ** 2 * (y[1] - y[0])
    den = (x[1] - x[0]) * (y[1] - y[2]) - (x[1] - x[2]) * (y[1] - y[0])
    assert math.log(m.n_opt) == pytest.approx(x[1] - 0.5 * num / den, rel=1e-10)
    assert m.d_opt == pytest.approx(1e14 / (6 * m.n_opt))
    assert m(np.exp(x)) == pytest.approx(y, abs=1e-12)  # through all three


def test_parabola_vertex_least_squares_reference() -> None:
    rng = np.random.default_rng(1)
    n = np.geomspace(1e5, 1e7, 6)
    loss = 0.08 * (np.log(n) - 14.0) ** 2 + 1.4 + rng.normal(0, 0.01, 6)
    m = isoflop_minimum(n, loss, budget=1e15)
    design = np.stack([np.log(n) ** 2, np.log(n), np.ones(6)], axis=1)
    c2, c1, c0 = np.linalg.lstsq(design, loss, rcond=None)[0]
    assert math.log(m.n_opt) == pytest.approx(-c1 / (2 * c2), rel=1e-9)
    dense = np.linspace(10, 18, 200001)
    values = c2 * dense**2 + c1 * dense + c0
    assert m.loss == pytest.approx(values.min(), abs=1e-9)


def test_power_law_fit_exact() -> None:
    x = np.array([1.0, 10.0, 100.0, 1000.0])
    law = fit_power_law(x, 3.0 * x**0.7)
    assert law == PowerLaw(coefficient=pytest.approx(3.0), exponent=pytest.approx(0.7))


def test_objective_gradient_and_huber() -> None:
    rng = np.random.default_rng(2)
    log_n, log_d = rng.normal(0, 1, 9), rng.normal(0, 1, 9)
    log_loss = rng.normal(0.4, 0.05, 9)
    for theta in rng.normal(0, 1, (5, 5)):
        err = check_grad(lambda t: float(_objective(t, log_n, log_d, log_loss, 0.5)[0]),
                         lambda t: _objective(t, log_n, log_d, log_loss, 0.5)[1], theta)
        assert err < 1e-5
    batch = rng.normal(0, 1, (4, 5))
    values, grads = _objective(batch, log_n, log_d, log_loss, 1e-3)
    for i in range(4):
        one = _objective(batch[i], log_n, log_d, log_loss, 1e-3)
        assert values[i] == pytest.approx(float(one[0])) and np.allclose(grads[i], one[1])
    r = np.array([-2.0, -1e-4, 0.0, 5e-4, 3.0])
    value, slope = huber(r, 1e-3)
    assert np.allclose(value, [2e-3 - 5e-7, 5e-9, 0, 1.25e-7, 3e-3 - 5e-7])
    assert np.allclose(slope, [-1e-3, -1e-4, 0, 5e-4, 1e-3])


def test_shipped_sweep_loads() -> None:
    sweep = load_sweep()
    assert len(sweep.grid) == 12 and len(sweep.holdout) == 1
    assert sweep.budgets == (2e13, 6e13, 2e14)
    holdout = sweep.holdout[0]
    assert holdout.n == 4_353_280 and holdout.val_loss == pytest.approx(1.3859, abs=1e-4)
    assert holdout.budget == 6e14
    for run in sweep.runs:
        assert run.flops == 6 * run.n * run.d
        assert abs(run.flops / run.budget - 1) < 0.005
        assert run.curve["val_loss"][-1] == run.val_loss
    assert sweep.info["device"] == "NVIDIA H200" and sweep.info["complete"]


def test_shipped_sweep_fits_hold_their_recorded_shape() -> None:
    # each budget's parabola opens upwards and the optimum grows with compute
    grid = load_sweep().grid
    fit = fit_approach2([r.n for r in grid], [r.val_loss for r in grid],
                        [r.budget for r in grid])
    optima = [m.n_opt for m in fit.minima]
    assert optima == sorted(optima) and 0.5 < fit.n_law.exponent < 1.0
    assert fit.n_law.exponent + fit.d_law.exponent == pytest.approx(1.0)


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="n must be finite and positive"):
        isoflop_minimum([1e5, 0, 1e6], [1.5, 1.4, 1.6], budget=1e14)
    with pytest.raises(ValueError, match="n needs at least 3 points"):
        isoflop_minimum([1e5, 1e6], [1.5, 1.4], budget=1e14)
    with pytest.raises(ValueError, match="budget must be a positive"):
        isoflop_minimum([1e5, 3e5, 1e6], [1.5, 1.4, 1.6], budget=-1)
    with pytest.raises(ValueError, match="opens downwards"):
        isoflop_minimum([1e5, 3e5, 1e6], [1.5, 1.6, 1.5], budget=1e14)
    with pytest.raises(ValueError, match="one length"):
        fit_approach2([1e5, 3e5, 1e6], [1.5, 1.4], [1e14] * 3)
    with pytest.raises(ValueError, match="at least 2 distinct budgets"):
        fit_approach2([1e5, 3e5, 1e6], [1.5, 1.4, 1.6], [1e14] * 3)
    with pytest.raises(ValueError, match="d must be finite and positive"):
        fit_approach3([1e5] * 5, [1e6, 1e6, -1, 1e6, 1e6], [1.5] * 5)
    with pytest.raises(ValueError, match="n needs at least 5 points"):
        fit_approach3([1e5] * 4, [1e6] * 4, [1.5] * 4)
    with pytest.raises(ValueError, match="delta must be positive"):
        fit_approach3([1e5] * 5, [1e6] * 5, [1.5] * 5, delta=0)
    with pytest.raises(ValueError, match="flops must be finite and positive"):
        CHINCHILLA.optimal(0.0)
    with pytest.raises(ValueError, match="d must be finite and positive"):
        CHINCHILLA.predict(1e6, 0)
    with pytest.raises(ValueError, match="x needs at least two distinct"):
        fit_power_law([5.0, 5.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="bare name"):
        load_sweep("../etc/passwd")
    with pytest.raises(FileNotFoundError, match="no recorded sweep"):
        load_sweep("no_such_sweep")
