"""Tests for lecture_pkg.length_extrapolation: RoPE's context-extension rules against Hugging
Face's ROPE_INIT_FUNCTIONS, and the position-scheme language model."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from lecture_pkg.length_extrapolation import (
    SCHEMES,
    PositionLM,
    PositionLMConfig,
    band_losses,
    byte_ids,
    random_windows,
    rope_dynamic_ntk,
    rope_linear,
    rope_ntk,
    rope_yarn,
    spaced_windows,
    train_position_lm,
    yarn_ramp,
)
from lecture_pkg.positional import alibi_bias, angular_frequencies, apply_rope

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

SMALL = {"d_model": 32, "num_heads": 2, "d_ff": 64, "max_positions": 32}


def hf_rope(rope_type: str, d_head: int, base: float, max_positions: int,
            seq_len: int | None = None, **params: object) -> tuple[torch.Tensor, float]:
    config = LlamaConfig(hidden_size=4 * d_head, num_attention_heads=4, head_dim=d_head,
                         max_position_embeddings=max_positions,
                         rope_parameters={"rope_type": rope_type, "rope_theta": base, **params})
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def close_to_hf(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Ours is float64, Hugging Face's float32: equal to float32's rounding."""
    assert ours.dtype == torch.float64 and ours.shape == theirs.shape
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=0)


# --------------------------------------------------------------------------- against HF

@pytest.mark.parametrize("d_head", [8, 16, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 8.0])
def test_linear_matches_hf(d_head: int, base: float, factor: float) -> None:
    inv_freq, scale = rope_linear(d_head, base, factor)
    ref, ref_scale = hf_rope("linear", d_head, base, 64, factor=factor)
    close_to_hf(inv_freq, ref)
    assert scale == ref_scale == 1.0


@pytest.mark.parametrize("d_head", [8, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("seq_len", [16, 64, 100, 256, 1000])
def test_dynamic_ntk_matches_hf(d_head: int, factor: float, seq_len: int) -> None:
    inv_freq, scale = rope_dynamic_ntk(d_head, 10000.0, factor, seq_len, 64)
    ref, ref_scale = hf_rope("dynamic", d_head, 10000.0, 64, seq_len=seq_len, factor=factor)
    close_to_hf(inv_freq, ref)
    assert scale == ref_scale == 1.0


@pytest.mark.parametrize("d_head", [8, 16, 64])
@pytest.mark.parametrize("s", [2, 4, 8])
def test_ntk_is_hf_dynamic_with_factor_one_at_s_times_the_length(d_head: int, s: int) -> None:
    inv_freq, _ = rope_ntk(d_head, 10000.0, float(s))
    ref, _ = hf_rope("dynamic", d_head, 10000.0, 64, seq_len=s * 64, factor=1.0)
    close_to_hf(inv_freq, ref)


@pytest.mark.parametrize("d_head", [8, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("max_positions", [64, 2048])
@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_matches_hf(d_head: int, factor: float, max_positions: int, truncate: bool) -> None:
    inv_freq, scale = rope_yarn(d_head, 10000.0, factor, max_positions, truncate=truncate)
    ref, ref_scale = hf_rope("yarn", d_head, 10000.0, max_positions, factor=factor,
                             original_max_position_embeddings=max_positions, truncate=truncate)
    close_to_hf(inv_freq, ref)
    assert scale == ref_scale


@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0), (64.0, 0.5)])
def test_yarn_betas_match_hf(betas: tuple[float, float]) -> None:
    inv_freq, scale = rope_yarn(64, 10000.0, 4.0, 4096, beta_fast=betas[0], beta_slow=betas[1])
    ref, ref_scale = hf_rope("yarn", 64, 10000.0, 4096, factor=4.0, beta_fast=betas[0],
                             beta_slow=betas[1], original_max_position_embeddings=4096)
    close_to_hf(inv_freq, ref)
    assert scale == ref_scale


# --------------------------------------------------------------------------- closed forms

def test_ntk_keeps_the_fastest_pair_and_interpolates_the_slowest_by_s() -> None:
    w = angular_frequencies(16, 10000.0)
    ntk, _ = rope_ntk(16, 10000.0, 4.0)
    assert ntk[0] == w[0] == 1
    torch.testing.assert_close(ntk[-1], w[-1] / 4, rtol=1e-12, atol=0)
    ratio = w / ntk  # interpolation of each pair: grows from 1 to s
    assert torch.all(ratio[1:] > ratio[:-1])


def test_yarn_interpolates_slow_pairs_and_keeps_fast_ones() -> None:
    w = angular_frequencies(128, 10000.0)
    inv_freq, scale = rope_yarn(128, 10000.0, 8.0, 4096)
    low, high, keep = yarn_ramp(128, 10000.0, 4096)
    turns = 4096 * w / (2 * math.pi)
    assert torch.all(keep[turns > 32] == 1) and torch.all(keep[turns < 1] == 0)
    torch.testing.assert_close(inv_freq[keep == 1], w[keep == 1], rtol=0, atol=0)
    torch.testing.assert_close(inv_freq[keep == 0], w[keep == 0] / 8, rtol=1e-15, atol=0)
    assert scale == pytest.approx(0.1 * math.log(8) + 1)
    assert 0 <= low < high <= 127


def test_factor_one_changes_nothing() -> None:
    w = angular_frequencies(16, 10000.0)
    for inv_freq, scale in (rope_linear(16, 1e4, 1.0), rope_ntk(16, 1e4, 1.0),
                            rope_yarn(16, 1e4, 1.0, 64), rope_dynamic_ntk(16, 1e4, 4.0, 64, 64)):
        torch.testing.assert_close(inv_freq, w, rtol=1e-14, atol=0)
        assert scale == 1.0


@pytest.mark.parametrize("bad", [0.5, float("nan"), float("inf"), -2.0])
def test_bad_factor_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match="factor"):
        rope_linear(16, 1e4, bad)
    with pytest.raises(TypeError, match="factor"):
        rope_ntk(16, 1e4, "4")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the model

def model(position: str, seed: int = 0) -> PositionLM:
    return PositionLM(PositionLMConfig(position=position, **SMALL), seed=seed).eval()


def ids(batch: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("position", SCHEMES)
def test_causal_prefix_gives_the_same_logits(position: str) -> None:
    """Positions below the training length see the same inputs at any evaluation length."""
    m, x = model(position), ids(2, 16)
    longer = torch.cat((x, ids(2, 48, seed=1)), dim=1)
    with torch.no_grad():
        short = m(x)
        if position == "learned":
            with pytest.raises(ValueError, match="max_positions"):
                m(longer)
            return
        torch.testing.assert_close(m(longer)[:, :16], short, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", SCHEMES)
def test_only_absolute_schemes_tell_a_repeated_token_apart(position: str) -> None:
    """On one token repeated, every value vector is the same, so a relative scheme (or none)
    returns the same output at every position; an absolute one adds a different vector."""
    m = model(position)
    x = torch.full((1, 8), 65)  # one byte repeated: only positions can tell the rows apart
    with torch.no_grad():
        out = m(x)
    differs = not torch.allclose(out[0, 3], out[0, 7], atol=1e-6)
    assert differs == (position in ("learned", "sinusoidal"))


def test_seed_fixes_weights_without_touching_the_global_generator() -> None:
    state = torch.random.get_rng_state()
    a, b = model("rope", seed=3), model("rope", seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(a.embed.weight, model("rope", seed=4).embed.weight)


def test_rope_path_is_apply_rope() -> None:
    m = model("rope")
    cos, sin = m._rope(10, torch.device("cpu"), torch.float64, None)
    x = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    ours = x * cos + torch.cat((-x[..., 8:], x[..., :8]), -1) * sin
    torch.testing.assert_close(ours, apply_rope(x, torch.arange(10)), rtol=1e-12, atol=1e-12)


def test_linear_scaling_is_positions_divided_by_the_factor() -> None:
    m = model("rope")
    cos, sin = m._rope(12, torch.device("cpu"), torch.float64, rope_linear(16, 1e4, 4.0))
    x = torch.randn(12, 16, dtype=torch.float64)
    ours = x * cos + torch.cat((-x[..., 8:], x[..., :8]), -1) * sin
    ref = apply_rope(x, torch.arange(12, dtype=torch.float64) / 4)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


def test_attention_factor_multiplies_cos_and_sin() -> None:
    m = model("rope")
    w = angular_frequencies(16, 1e4)
    cos1, sin1 = m._rope(5, torch.device("cpu"), torch.float64, (w, 1.0))
    cos2, sin2 = m._rope(5, torch.device("cpu"), torch.float64, (w, 1.25))
    torch.testing.assert_close(cos2, 1.25 * cos1)
    torch.testing.assert_close(sin2, 1.25 * sin1)


def test_alibi_and_t5_biases_are_the_packages() -> None:
    m = model("alibi")
    bias = m._bias(6, torch.device("cpu"), torch.float32)
    ref = alibi_bias(2, 6, 6)
    lower = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(bias[:, lower], ref[:, lower])
    assert torch.all(bias[:, ~lower] == float("-inf"))
    t5 = model("t5")
    assert t5.t5 is not None and not t5.t5.bidirectional
    assert t5.t5.max_distance == SMALL["max_positions"]
    assert model("rope")._bias(6, torch.device("cpu"), torch.float32) is None


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="position"):
        PositionLMConfig(position="xpos")
    with pytest.raises(ValueError, match="rope"):
        model("alibi")(ids(1, 4), rope=rope_linear(16, 1e4, 2.0))
    with pytest.raises(ValueError, match="inv_freq"):
        model("rope")(ids(1, 4), rope=(torch.ones(3), 1.0))
    with pytest.raises(ValueError, match="ids"):
        model("rope")(ids(1, 4).float())
    with pytest.raises(ValueError, match="even"):
        PositionLMConfig(d_model=24, num_heads=8)


# --------------------------------------------------------------------------- data, training, eval

def test_windows() -> None:
    data = torch.arange(100)
    w = random_windows(data, 9, 5, torch.Generator().manual_seed(0))
    assert w.shape == (5, 10) and torch.all(w[:, 1:] - w[:, :-1] == 1)
    s = spaced_windows(data, 9, 4)
    assert s[0, 0] == 0 and s[-1, -1] == 99 and torch.all(s[:, 1:] - s[:, :-1] == 1)
    with pytest.raises(ValueError, match="window"):
        spaced_windows(data, 100, 2)
    assert byte_ids("aé").tolist() == [97, 195, 169]


def test_band_losses_is_per_position_cross_entropy() -> None:
    m, w = model("alibi"), ids(5, 13, seed=2)
    with torch.no_grad():
        logits = m(w[:, :-1])
    ref = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none").mean(0)
    ours = band_losses(m, w, batch_size=2)
    assert ours.shape == (12,) and ours.dtype == torch.float64
    torch.testing.assert_close(ours.float(), ref, rtol=1e-5, atol=1e-5)


def test_training_learns_a_periodic_text_and_is_deterministic() -> None:
    text = byte_ids("abcdefgh" * 200)
    a = PositionLM(PositionLMConfig(position="rope", **SMALL), seed=0)
    b = copy.deepcopy(a)
    before = band_losses(a, spaced_windows(text, 16, 8)).mean()
    loss = train_position_lm(a, text, length=16, steps=40, seed=1, batch_size=8)
    train_position_lm(b, text, length=16, steps=40, seed=1, batch_size=8)
    after = band_losses(a, spaced_windows(text, 16, 8)).mean()
    assert before > 5 and after < 0.5 and loss < 1.0
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
