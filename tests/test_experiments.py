"""lecture_pkg.experiments against scipy.stats on fixed inputs."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from lecture_pkg.experiments import Arm, compare, run_arm, t_quantile, t_two_sided_p

# Three seeds of two arms on shared seeds (a perplexity-like number: lower is better).
A = [4.812, 4.790, 4.851]
B = [4.870, 4.861, 4.902]
# Five seeds, unequal spreads, for Welch's t.
C = [0.81, 0.79, 0.84, 0.80, 0.86]
D = [0.75, 0.83, 0.70, 0.78, 0.72]


@pytest.mark.parametrize("df", [1, 2, 3.7, 4, 9, 30, 200])
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 7.0, 40.0])
def test_t_distribution_matches_scipy(t: float, df: float) -> None:
    assert t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9, abs=1e-14)
    assert t_two_sided_p(-t, df) == t_two_sided_p(t, df)


@pytest.mark.parametrize("df", [1, 2, 4, 7.3, 50])
@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_t_quantile_matches_scipy(level: float, df: float) -> None:
    assert t_quantile(level, df) == pytest.approx(stats.t.ppf((1 + level) / 2, df), rel=1e-9)


def test_paired_matches_ttest_rel() -> None:
    result = compare(A, B, paired=True, higher_is_better=False)
    ref = stats.ttest_rel(A, B)
    diffs = [x - y for x, y in zip(A, B)]
    se = stats.sem(diffs)
    half = stats.t.ppf(0.975, len(diffs) - 1) * se
    assert result.test == "paired t" and result.n == 3
    assert result.effect == pytest.approx(sum(diffs) / 3, rel=1e-12)
    assert result.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (result.low, result.high) == pytest.approx((result.effect - half, result.effect + half), rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (result.low, result.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # a is lower on every seed, a loss: the interval excludes zero, so a is "better"
    assert result.high < 0 and result.verdict == "better" and result.resolved
    assert compare(A, B, paired=True, higher_is_better=True).verdict == "worse"
    assert compare(B, A, paired=True, higher_is_better=False).verdict == "worse"


def test_welch_matches_ttest_ind() -> None:
    for level in (0.9, 0.95, 0.99):
        result = compare(C, D, paired=False, level=level)
        ref = stats.ttest_ind(C, D, equal_var=False)
        ci = ref.confidence_interval(level)
        assert result.test == "Welch's t"
        assert result.p_value == pytest.approx(ref.pvalue, rel=1e-9)
        assert (result.low, result.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
        assert result.verdict == ("better" if ci.low > 0 else "within the noise")
    assert compare(C, D, paired=False, level=0.95).verdict == "better"   # p = 0.045
    assert compare(C, D, paired=False, level=0.99).verdict == "within the noise"


def test_within_the_noise_and_formatting() -> None:
    noisy = compare([0.80, 0.90, 0.70], [0.82, 0.71, 0.86], paired=True)
    assert noisy.verdict == "within the noise" and not noisy.resolved and noisy.low < 0 < noisy.high
    assert noisy.summary() == (f"{noisy.effect:+.3f} (95% CI {noisy.low:+.3f} to {noisy.high:+.3f}; "
                               f"paired t, p = {noisy.p_value:.3f}): within the noise")
    arm = Arm("x", (0.81, 0.80, 0.82))
    assert arm.summary() == "0.810 ± 0.010" and arm.sd == pytest.approx(stats.tstd([0.81, 0.80, 0.82]))


def test_identical_differences() -> None:
    same = compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], paired=True)
    assert same.effect == 0 and same.p_value == 1.0 and same.verdict == "within the noise"
    shifted = compare([1.5, 2.5, 3.5], [1.0, 2.0, 3.0], paired=True)
    assert shifted.p_value == 0.0 and shifted.low == shifted.high == pytest.approx(0.5)
    assert shifted.verdict == "better"


def test_run_arm_keeps_seeds() -> None:
    arm = run_arm("square", lambda s: s * s, [2, 3, 4])
    assert arm.values == (4.0, 9.0, 16.0) and arm.seeds == (2, 3, 4) and arm.mean == pytest.approx(29 / 3)
    other = run_arm("other", lambda s: s, [5, 6, 7])
    with pytest.raises(ValueError, match="must share seeds"):
        compare(arm, other, paired=True)
    assert compare(arm, other, paired=False).test == "Welch's t"
    with pytest.raises(ValueError, match="seeds is empty"):
        run_arm("none", float, [])


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"a \('a'\) has 1 value"):
        compare([1.0], [1.0, 2.0], paired=False)
    with pytest.raises(ValueError, match=r"b \('b'\) has 1 value"):
        compare([1.0, 2.0], [1.0], paired=False)
    with pytest.raises(ValueError, match="a has 3 values, b has 2"):
        compare([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)
    with pytest.raises(ValueError, match="NaN"):
        compare([1.0, math.nan], [1.0, 2.0], paired=False)
    with pytest.raises(ValueError, match="NaN or infinite"):
        Arm("x", (1.0, math.inf))
    with pytest.raises(ValueError, match="3 values but 2 seeds"):
        Arm("x", (1.0, 2.0, 3.0), (0, 1))
    with pytest.raises(TypeError, match="paired must be True or False"):
        compare([1.0, 2.0], [1.0, 2.0], paired=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a must be an Arm or a sequence"):
        compare(1.0, [1.0, 2.0], paired=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level must be"):
        compare([1.0, 2.0], [1.0, 2.0], paired=False, level=95)
    with pytest.raises(ValueError, match="df must be positive"):
        t_two_sided_p(1.0, 0)


def test_glue_writes_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from lecture_pkg import viz

    glued: dict[str, object] = {}
    monkeypatch.setattr(viz, "glue", lambda name, value, display=False: glued.__setitem__(name, value))
    result = compare(A, B, paired=True, higher_is_better=False)
    result.glue("ls")
    assert glued["ls_verdict"] == "better" and glued["ls_test"] == "paired t"
    assert glued["ls_effect"] == f"{result.effect:+.3f}" and glued["ls_summary"] == result.summary()
    assert set(glued) == {f"ls_{k}" for k in ("effect", "ci", "p", "verdict", "test", "summary")}
