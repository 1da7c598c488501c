"""Comparing trained arms over seeds: per-seed results, a stated test, a verdict for the prose.

A chapter that compares two ways of training (label smoothing or not, Swin or ViT) runs each arm
over the same seeds (:func:`lecture_pkg.seeds`) and asks :func:`compare` whether the gap is larger
than the seed-to-seed noise::

    smooth = run_arm("smoothed", train_smoothed, seeds(5))
    plain = run_arm("plain", train_plain, seeds(5))
    result = compare(smooth, plain, paired=True, higher_is_better=False)
    result.summary()  # '-0.041 (95% CI -0.070 to -0.012; paired t, p = 0.018): better'

**The test.** A two-sided Student t test at ``level`` (95 % by default):

* *paired* (``paired=True``) when both arms ran on the same seeds and the same data, so that seed
  ``s`` of one arm and seed ``s`` of the other share data order and initialisation: the test is on
  the per-seed differences, whose spread excludes what the two arms have in common;
* *Welch's* (``paired=False``) otherwise: unequal variances, Welch-Satterthwaite degrees of freedom.

The t distribution rather than a normal "2 standard errors" rule, because with a handful of seeds
the standard error is itself a rough estimate: with 3 seeds (2 degrees of freedom) the 95 %
interval is the mean difference +- 4.30 standard errors, not +- 1.96. A gap is called "better" or
"worse" only when its confidence interval excludes zero; otherwise it is "within the noise", and a
chapter says so with this computed verdict and asserts no direction. More seeds narrow the
interval: use them where a verdict matters and the page's time budget allows.

The t distribution is computed here in float64 (regularised incomplete beta function), so that
chapters 1-6 need no SciPy; ``tests/test_experiments.py`` checks it against ``scipy.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Arm", "Comparison", "compare", "run_arm", "t_quantile", "t_two_sided_p"]


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment: its name and one result per seed.

    ``values[i]`` is the result of seed ``seeds[i]``; ``seeds`` may be empty when unknown (then
    a paired comparison cannot check that two arms share their seeds).
    """

    name: str
    values: tuple[float, ...]
    seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        values = tuple(float(v) for v in self.values)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not values:
            raise ValueError(f"arm {self.name!r} has no values (one per seed expected)")
        if any(math.isnan(v) or math.isinf(v) for v in values):
            raise ValueError(f"arm {self.name!r} has a NaN or infinite value: {values}")
        if self.seeds and len(self.seeds) != len(values):
            raise ValueError(f"arm {self.name!r} has {len(values)} values but {len(self.seeds)} seeds")

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / self.n

    @property
    def sd(self) -> float:
        """Sample standard deviation (n - 1 in the denominator); 0.0 for a single value."""
        if self.n < 2:
            return 0.0
        m = self.mean
        return math.sqrt(math.fsum((v - m) ** 2 for v in self.values) / (self.n - 1))

    def summary(self, digits: int = 3) -> str:
        """``'0.812 ± 0.006'``: mean ± sample standard deviation over the seeds."""
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}"


def run_arm(name: str, fn: Callable[[int], float], seeds: Sequence[int]) -> Arm:
    """Run ``fn(seed)`` for every seed and keep each result: ``Arm(name, values, seeds)``."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed (two to compare arms)")
    return Arm(name, tuple(float(fn(s)) for s in seeds), tuple(seeds))


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`: arm ``a`` relative to arm ``b``.

    ``effect`` is mean(a) - mean(b) (for paired arms, the mean of the per-seed differences, the
    same number); ``low``/``high`` its confidence interval at ``level``; ``verdict`` is "better",
    "worse" (a relative to b, given ``higher_is_better``) or "within the noise".
    """

    a: str
    b: str
    effect: float
    low: float
    high: float
    p_value: float
    test: str
    level: float
    n: int
    verdict: str

    @property
    def resolved(self) -> bool:
        """True when the interval excludes zero (verdict "better" or "worse")."""
        return self.verdict != "within the noise"

    def interval(self, digits: int = 3) -> str:
        """``'95% CI -0.070 to -0.012'``."""
        return f"{self.level:.0%} CI {self.low:+.{digits}f} to {self.high:+.{digits}f}"

    def summary(self, digits: int = 3) -> str:
        """``'-0.041 (95% CI -0.070 to -0.012; paired t, p = 0.018): better'``."""
        return (f"{self.effect:+.{digits}f} ({self.interval(digits)}; {self.test}, "
                f"p = {self.p_value:.3f}): {self.verdict}")

    def glue(self, name: str, digits: int = 3) -> None:
        """Glue ``name_effect``, ``name_ci``, ``name_p``, ``name_verdict``, ``name_test`` and
        ``name_summary`` (strings formatted with ``digits``) for the prose."""
        from lecture_pkg import viz

        for key, value in {
            "effect": f"{self.effect:+.{digits}f}", "ci": self.interval(digits), "p": f"{self.p_value:.3f}",
            "verdict": self.verdict, "test": self.test, "summary": self.summary(digits),
        }.items():
            viz.glue(f"{name}_{key}", value)


def _as_arm(x: Arm | Sequence[float], name: str) -> Arm:
    if isinstance(x, Arm):
        return x
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence):
        raise TypeError(f"{name} must be an Arm or a sequence of floats, got {type(x).__name__}")
    return Arm(name, tuple(x))


def compare(a: Arm | Sequence[float], b: Arm | Sequence[float], *, paired: bool,
            higher_is_better: bool = True, level: float = 0.95) -> Comparison:
    """Compare arm ``a`` with arm ``b`` by a two-sided t test (see the module's docstring).

    ``paired=True``: the arms ran on the same seeds and data (paired t on the per-seed
    differences; the arms must have equal lengths and, where both record them, equal seeds).
    ``paired=False``: Welch's t (independent arms, variances not assumed equal).
    ``higher_is_better`` turns the sign of the effect into "better" or "worse" (False for a
    loss or a perplexity). Each arm needs at least 2 finite values.
    """
    if not isinstance(paired, bool):
        raise TypeError(f"paired must be True or False, got {paired!r}")
    if not 0.5 <= level < 1:
        raise ValueError(f"level must be in [0.5, 1), got {level!r}")
    a, b = _as_arm(a, "a"), _as_arm(b, "b")
    for arm, label in ((a, "a"), (b, "b")):
        if arm.n < 2:
            raise ValueError(f"{label} ({arm.name!r}) has {arm.n} value; comparing arms needs at least "
                             "2 seeds per arm (the seed-to-seed spread cannot be estimated from one)")
    if paired:
        if a.n != b.n:
            raise ValueError(f"paired arms need one value per shared seed: a has {a.n} values, b has {b.n}")
        if a.seeds and b.seeds and a.seeds != b.seeds:
            raise ValueError(f"paired arms must share seeds: a has {a.seeds}, b has {b.seeds}")
        diffs = Arm("a - b", tuple(x - y for x, y in zip(a.values, b.values, strict=True)))
        effect, se, df, test = diffs.mean, diffs.sd / math.sqrt(diffs.n), diffs.n - 1, "paired t"
    else:
        va, vb = a.sd**2 / a.n, b.sd**2 / b.n
        effect, se, test = a.mean - b.mean, math.sqrt(va + vb), "Welch's t"
        # Welch-Satterthwaite degrees of freedom (n - 1 of the larger arm when both spreads are 0)
        df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1)) if va + vb > 0 else max(a.n, b.n) - 1
    if se == 0:  # identical differences: the interval is the point; any nonzero gap is resolved
        p_value, half = (1.0 if effect == 0 else 0.0), 0.0
    else:
        p_value, half = t_two_sided_p(effect / se, df), t_quantile(level, df) * se
    low, high = effect - half, effect + half
    if low > 0 or high < 0:
        verdict = "better" if (effect > 0) == higher_is_better else "worse"
    else:
        verdict = "within the noise"
    return Comparison(a.name, b.name, effect, low, high, p_value, test, level, min(a.n, b.n), verdict)


# ---- Student's t distribution in float64 -------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if not df > 0:
        raise ValueError(f"df must be positive, got {df!r}")
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(level: float, df: float) -> float:
    """The t with P(|T| <= t) = ``level`` (e.g. 4.303 for level 0.95, df 2), by bisection."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 1 - level:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_p(mid, df) > 1 - level:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2
