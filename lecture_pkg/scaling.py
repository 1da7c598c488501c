"""Scaling laws fitted to a recorded isoFLOP sweep: Chinchilla's approaches 2 and 3.

The sweep (``scripts/scaling_sweep.py``, shipped as ``lecture_pkg/recorded/*.json``) trains one
family of decoders at several compute budgets ``C = 6 N D`` (``N`` non-embedding parameters,
``D`` training tokens, ``C`` in FLOPs); every run records its final held-out loss ``L`` in nats
per token. Two ways to read a compute-optimal allocation off such runs, after Hoffmann et al.
(2022):

* **Approach 2** (:func:`fit_approach2`): for each budget, fit a parabola of ``L`` in ``ln N``
  (:func:`isoflop_minimum`); its vertex is ``N_opt(C)`` and ``D_opt = C / (6 N_opt)``. Then fit
  ``N_opt = k C^a`` and ``D_opt = k' C^b`` by least squares in log space
  (:func:`fit_power_law`). Since ``N_opt D_opt = C / 6``, ``a + b = 1``.
* **Approach 3** (:func:`fit_approach3`): fit ``L(N, D) = E + A / N^alpha + B / D^beta`` to every
  run at once, minimising the Huber loss of log-space residuals with L-BFGS from a grid of
  initialisations (appendix D.2 of the paper). Minimising ``L`` at fixed ``C`` gives the closed
  form ``N_opt = G (C/6)^(beta/(alpha+beta))``, ``G = (alpha A / (beta B))^(1/(alpha+beta))``
  (:meth:`ParametricLaw.optimal`).

Arrays are 1-D NumPy float64 of one length ``(runs,)``; scalars are Python floats.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

__all__ = ["HOFFMANN_GRID", "Approach2Fit", "IsoFlopMinimum", "ParametricLaw", "PowerLaw", "Run",
           "Sweep", "fit_approach2", "fit_approach3", "fit_power_law", "huber",
           "isoflop_minimum", "load_sweep"]

# Appendix D.2 of Hoffmann et al. (2022): the initialisations of (alpha, beta, e, a, b), with
# E = exp(e), A = exp(a), B = exp(b).
HOFFMANN_GRID: dict[str, tuple[float, ...]] = {
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0), "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0), "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)}


# ---------------------------------------------------------------- the recorded sweep


@dataclass(frozen=True)
class Run:
    """One training run of the sweep. ``n``: non-embedding parameters (``params``: all of them,
    embedding table and output layer included); ``d``: training tokens;
    ``flops = 6 n d``; ``budget``: the nominal ``C`` of its isoFLOP curve (``d`` is rounded to
    whole steps, so ``flops`` is within 0.3 % of it); ``val_loss``: final held-out loss (nats per
    token); ``epochs``: passes over the training set; ``curve``: the validation curve
    (``steps``, ``tokens``, ``val_loss``, ``train_loss`` lists); ``role``: ``"grid"`` (fitted)
    or ``"holdout"`` (never fitted)."""

    role: str
    budget: float
    n_layer: int
    d_model: int
    n: int
    params: int
    d: int
    flops: float
    epochs: float
    val_loss: float
    train_loss: float
    seconds: float
    curve: dict[str, list[float]]


@dataclass(frozen=True)
class Sweep:
    """A recorded sweep: its runs and the facts of how it ran (``info``: command, commit, device,
    torch, settings, corpus sizes; everything in the JSON except the runs)."""

    runs: tuple[Run, ...]
    info: dict[str, Any]

    @property
    def grid(self) -> tuple[Run, ...]:
        """The runs a fit may see."""
        return tuple(r for r in self.runs if r.role == "grid")

    @property
    def holdout(self) -> tuple[Run, ...]:
        """The runs no fit may see."""
        return tuple(r for r in self.runs if r.role == "holdout")

    @property
    def budgets(self) -> tuple[float, ...]:
        """The grid's compute budgets ``C``, ascending."""
        return tuple(sorted({r.budget for r in self.grid}))


def load_sweep(name: str = "scaling_sweep_h200") -> Sweep:
    """Load ``lecture_pkg/recorded/<name>.json`` (through importlib.resources, so it works from
    an installed package) as a :class:`Sweep`."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"name must be a recorded sweep's bare name, got {name!r}")
    path = resources.files("lecture_pkg") / "recorded" / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no recorded sweep {name}.json in lecture_pkg/recorded")
    payload = json.loads(path.read_text(encoding="utf-8"))
    runs = tuple(Run(role=r["role"], budget=float(r["flops_budget"]), n_layer=int(r["n_layer"]),
                     d_model=int(r["d_model"]), n=int(r["non_embedding_params"]),
                     params=int(r["params"]), d=int(r["tokens"]), flops=float(r["flops"]), epochs=float(r["epochs"]),
                     val_loss=float(r["val_loss"]), train_loss=float(r["train_loss"]),
                     seconds=float(r["seconds"]), curve=r["curve"])
                 for r in payload["runs"])
    return Sweep(runs=runs, info={k: v for k, v in payload.items() if k != "runs"})


# ---------------------------------------------------------------- checks


def _positive(name: str, values: Sequence[float] | np.ndarray, minimum: int = 1) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (runs,), got shape {array.shape}")
    if len(array) < minimum:
        raise ValueError(f"{name} needs at least {minimum} points, got {len(array)}")
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(f"{name} must be finite and positive, got {array.tolist()}")
    return array


def _same_length(**arrays: np.ndarray) -> None:
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"arguments must have one length (runs,), got {lengths}")


# ---------------------------------------------------------------- approach 2


@dataclass(frozen=True)
class PowerLaw:
    """``y = coefficient * x ** exponent``, fitted as a straight line in log-log space."""

    coefficient: float
    exponent: float

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.coefficient * np.asarray(x, dtype=np.float64) ** self.exponent


def fit_power_law(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> PowerLaw:
    """Least squares of ``ln y = ln k + a ln x``. ``x``, ``y``: (points,), positive, at least two
    distinct ``x``."""
    xs, ys = _positive("x", x, 2), _positive("y", y, 2)
    _same_length(x=xs, y=ys)
    if np.ptp(np.log(xs)) == 0:
        raise ValueError("x needs at least two distinct values")
    slope, intercept = np.polyfit(np.log(xs), np.log(ys), 1)
    return PowerLaw(coefficient=float(np.exp(intercept)), exponent=float(slope))


@dataclass(frozen=True)
class IsoFlopMinimum:
    """The vertex of one isoFLOP parabola ``L = c2 x^2 + c1 x + c0``, ``x = ln N``: the budget
    ``C`` (FLOPs), the optimal size ``n_opt``, tokens ``d_opt = C / (6 n_opt)``, the loss there,
    and the coefficients ``(c2, c1, c0)`` (``c2 > 0``: nats per squared e-fold of ``N``)."""

    budget: float
    n_opt: float
    d_opt: float
    loss: float
    coefficients: tuple[float, float, float]

    def __call__(self, n: float | np.ndarray) -> float | np.ndarray:
        """The parabola's loss at size ``n``."""
        return np.polyval(self.coefficients, np.log(np.asarray(n, dtype=np.float64)))


def isoflop_minimum(n: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray,
                    budget: float) -> IsoFlopMinimum:
    """Fit a parabola of ``loss`` in ``ln n`` (least squares, at least 3 sizes) for one budget
    ``C`` and return its vertex. Raises if the parabola opens downwards (no minimum)."""
    ns, losses = _positive("n", n, 3), _positive("loss", loss, 3)
    _same_length(n=ns, loss=losses)
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a positive number of FLOPs, got {budget}")
    if len(np.unique(ns)) < 3:
        raise ValueError("n needs at least 3 distinct sizes for a parabola")
    c2, c1, c0 = np.polyfit(np.log(ns), losses, 2)
    if c2 <= 0:
        raise ValueError(f"the isoFLOP parabola at budget {budget:g} opens downwards "
                         f"(curvature {c2:.3g}): no minimum")
    x = -c1 / (2 * c2)
    n_opt = math.exp(x)
    return IsoFlopMinimum(budget=float(budget), n_opt=n_opt, d_opt=budget / (6 * n_opt),
                          loss=float(c0 - c1 * c1 / (4 * c2)),
                          coefficients=(float(c2), float(c1), float(c0)))


@dataclass(frozen=True)
class Approach2Fit:
    """Approach 2: the per-budget minima, ``N_opt = n_law(C)``, ``D_opt = d_law(C)``, and the
    minimum loss ``loss_law(C)`` (a power law in ``C``, fitted to the minima's losses)."""

    minima: tuple[IsoFlopMinimum, ...]
    n_law: PowerLaw
    d_law: PowerLaw
    loss_law: PowerLaw

    @property
    def curvature(self) -> float:
        """Mean curvature ``c2`` of the budgets' parabolas (nats per squared e-fold of N)."""
        return float(np.mean([m.coefficients[0] for m in self.minima]))

    def predict(self, n: float, budget: float) -> float:
        """Loss of size ``n`` at budget ``C``: ``loss_law(C) + curvature (ln n - ln N_opt)^2``,
        the isoFLOP parabola extrapolated with its vertex from the two laws and its curvature
        the mean of the fitted ones (an assumption: the curvature does not change with C)."""
        _positive("n", [n])
        _positive("budget", [budget])
        offset = math.log(n) - math.log(float(self.n_law(budget)))
        return float(self.loss_law(budget)) + self.curvature * offset**2


def fit_approach2(n: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray,
                  budget: Sequence[float] | np.ndarray) -> Approach2Fit:
    """Approach 2 on runs ``(n, loss, budget)``, each (runs,): runs of one budget form one
    isoFLOP curve (at least 3 sizes each); at least 2 budgets."""
    ns, losses, budgets = _positive("n", n), _positive("loss", loss), _positive("budget", budget)
    _same_length(n=ns, loss=losses, budget=budgets)
    levels = np.unique(budgets)
    if len(levels) < 2:
        raise ValueError(f"budget needs at least 2 distinct budgets, got {levels.tolist()}")
    minima = tuple(isoflop_minimum(ns[budgets == c], losses[budgets == c], float(c))
                   for c in levels)
    cs = [m.budget for m in minima]
    return Approach2Fit(minima=minima, n_law=fit_power_law(cs, [m.n_opt for m in minima]),
                        d_law=fit_power_law(cs, [m.d_opt for m in minima]),
                        loss_law=fit_power_law(cs, [m.loss for m in minima]))


# ---------------------------------------------------------------- approach 3


@dataclass(frozen=True)
class ParametricLaw:
    """``L(N, D) = E + A / N^alpha + B / D^beta`` (nats per token; ``N`` parameters, ``D``
    tokens). ``E``: the irreducible loss; the other terms: what a finite model and finite data
    add to it."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def __call__(self, n: float | np.ndarray, d: float | np.ndarray) -> float | np.ndarray:
        """The loss at ``(n, d)``; arrays broadcast."""
        n = np.asarray(n, dtype=np.float64)
        d = np.asarray(d, dtype=np.float64)
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def predict(self, n: float, d: float) -> float:
        """The loss of one run of ``n`` parameters on ``d`` tokens."""
        _positive("n", [n])
        _positive("d", [d])
        return float(self(n, d))

    @property
    def G(self) -> float:
        """``(alpha A / (beta B))^(1 / (alpha + beta))``."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    @property
    def a(self) -> float:
        """Exponent of ``N_opt proportional to C^a``: ``beta / (alpha + beta)``."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """Exponent of ``D_opt proportional to C^b``: ``alpha / (alpha + beta)``."""
        return self.alpha / (self.alpha + self.beta)

    def optimal(self, flops: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The minimiser of ``L`` on ``6 N D = flops``: ``N_opt = G (C/6)^a``,
        ``D_opt = G^-1 (C/6)^b``. Returns ``(n_opt, d_opt)`` of the shape of ``flops``."""
        c = _positive("flops", np.atleast_1d(flops)).reshape(np.shape(flops))
        if self.alpha <= 0 or self.beta <= 0:
            raise ValueError(f"alpha and beta must be positive for an optimum, got "
                             f"{self.alpha}, {self.beta}")
        return self.G * (c / 6) ** self.a, (c / 6) ** self.b / self.G

    def tokens_per_parameter(self, flops: float) -> float:
        """``D_opt / N_opt`` at budget ``flops``."""
        n_opt, d_opt = self.optimal(flops)
        return float(d_opt / n_opt)


def huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber loss of residuals ``r`` (any shape) and its derivative, elementwise."""
    small = np.abs(r) <= delta
    value = np.where(small, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta))
    return value, np.clip(r, -delta, delta)


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray,
               delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Sum of Huber(LSE(a - alpha ln N, b - beta ln D, e) - ln L) over runs and its gradient in
    ``theta = (e, a, b, alpha, beta)``; ``theta`` (5,) or a batch (points, 5), giving a value
    () or (points,) and a gradient of ``theta``'s shape."""
    e, a, b, alpha, beta = (theta[..., i, None] for i in range(5))
    terms = np.stack(np.broadcast_arrays(a - alpha * log_n, b - beta * log_d, e))
    top = terms.max(0)
    weights = np.exp(terms - top)
    total = weights.sum(0)
    value, slope = huber(top + np.log(total) - log_loss, delta)
    w = weights / total * slope  # (3, ..., runs)
    grad = np.stack([w[2].sum(-1), w[0].sum(-1), w[1].sum(-1), -(w[0] * log_n).sum(-1),
                     -(w[1] * log_d).sum(-1)], axis=-1)
    return value.sum(-1), grad


def fit_approach3(n: Sequence[float] | np.ndarray, d: Sequence[float] | np.ndarray,
                  loss: Sequence[float] | np.ndarray, delta: float = 1e-3,
                  grid: dict[str, Sequence[float]] | None = None,
                  starts: int | None = 32) -> ParametricLaw:
    """Fit ``L(N, D) = E + A / N^alpha + B / D^beta`` to runs ``(n, d, loss)``, each (runs,),
    at least 5 runs (five parameters).

    Minimises the summed Huber loss (``delta``) of ``ln L_fit - ln L`` over
    ``(e, a, b, alpha, beta)`` (``E = e^e``, ``A = e^a``, ``B = e^b``) with SciPy's L-BFGS-B,
    started from every point of ``grid`` (default :data:`HOFFMANN_GRID`, 4,500 points) when
    ``starts`` is None, else from the ``starts`` grid points of lowest objective; the lowest
    optimum wins. Internally ``ln N`` and ``ln D`` are centred (``a`` and ``b`` shift to match),
    which changes neither the objective nor the optimum but conditions the problem: ``a`` and
    ``alpha`` are otherwise almost collinear. The tolerances are tight because the objective
    is small (Huber of residuals of about 1e-2 is about 1e-5 a run)."""
    from scipy.optimize import minimize

    ns, ds, losses = _positive("n", n, 5), _positive("d", d, 5), _positive("loss", loss, 5)
    _same_length(n=ns, d=ds, loss=losses)
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be positive, got {delta}")
    if starts is not None and starts < 1:
        raise ValueError(f"starts must be a positive number of initialisations, got {starts}")
    grid = HOFFMANN_GRID if grid is None else grid
    points = np.array(list(itertools.product(grid["e"], grid["a"], grid["b"], grid["alpha"],
                                             grid["beta"])), dtype=np.float64)
    mean_n, mean_d = np.log(ns).mean(), np.log(ds).mean()
    points[:, 1] -= points[:, 3] * mean_n  # a - alpha ln N = (a - alpha m) - alpha (ln N - m)
    points[:, 2] -= points[:, 4] * mean_d
    args = (np.log(ns) - mean_n, np.log(ds) - mean_d, np.log(losses), delta)
    if starts is not None and starts < len(points):
        values = _objective(points, *args)[0]
        points = points[np.argsort(values, kind="stable")[:starts]]
    options = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000}
    best = None
    for point in points:
        result = minimize(_objective, point, args=args, jac=True, method="L-BFGS-B",
                          options=options)
        if best is None or result.fun < best.fun:
            best = result
    e, a, b, alpha, beta = best.x
    a, b = a + alpha * mean_n, b + beta * mean_d
    return ParametricLaw(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=float(alpha),
                         beta=float(beta))
