"""lecture_pkg.positional against independent references: the paper's formula written as float64
loops, Python's own binary digits, complex-number rotations, the ALiBi repository's slope rule,
and HF transformers (T5 buckets and bias, Llama rotary embedding, BLOOM ALiBi)."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    angular_frequencies,
    apply_rope,
    binary_encoding,
    relative_positions,
    shift_matrix,
    sinusoidal_encoding,
    t5_relative_position_bucket,
)

transformers = pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

even_dims = st.integers(1, 48).map(lambda h: 2 * h)
F64 = torch.float64


# --------------------------------------------------------------------------- sinusoids

def paper_table(num_positions: int, d_model: int, base: float) -> np.ndarray:
    """PE as written in "Attention Is All You Need", one entry at a time."""
    table = np.empty((num_positions, d_model))
    for pos in range(num_positions):
        for i in range(d_model // 2):
            table[pos, 2 * i] = math.sin(pos / base ** (2 * i / d_model))
            table[pos, 2 * i + 1] = math.cos(pos / base ** (2 * i / d_model))
    return table


@pytest.mark.parametrize("num_positions, d_model, base", [(50, 16, 10000.0), (7, 2, 10.0), (300, 64, 500.0)])
def test_sinusoidal_matches_paper_formula(num_positions: int, d_model: int, base: float) -> None:
    ours = sinusoidal_encoding(num_positions, d_model, base, dtype=F64).numpy()
    np.testing.assert_allclose(ours, paper_table(num_positions, d_model, base), rtol=0, atol=1e-12)


def test_sinusoidal_dtype_device_and_empty() -> None:
    assert sinusoidal_encoding(3, 8).dtype == torch.get_default_dtype()
    half = sinusoidal_encoding(3, 8, dtype=torch.float16, device="cpu")
    assert half.dtype == torch.float16 and half.device.type == "cpu"
    assert sinusoidal_encoding(0, 8).shape == (0, 8)
    np.testing.assert_allclose(angular_frequencies(8, 100.0).numpy(), [100.0 ** (-j / 8) for j in (0, 2, 4, 6)])


@settings(max_examples=60, deadline=None)
@given(d_model=even_dims, k=st.integers(-60, 60), positions=st.lists(st.integers(0, 400), min_size=1, max_size=8),
       base=st.sampled_from([10.0, 1000.0, 10000.0]))
def test_shift_identity(d_model: int, k: int, positions: list[int], base: float) -> None:
    """PE[p + k] = PE[p] @ R_k, with both sides from the paper's formula (not from our table)."""
    reference = paper_table(max(positions) + abs(k) + 1, d_model, base)
    shift = shift_matrix(k, d_model, base, dtype=F64).numpy()
    for p in positions:
        if p + k >= 0:
            np.testing.assert_allclose(reference[p] @ shift, reference[p + k], rtol=0, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(d_model=even_dims, a=st.floats(-100, 100), b=st.floats(-100, 100))
def test_shift_matrix_is_a_block_diagonal_rotation_group(d_model: int, a: float, b: float) -> None:
    r_a, r_b = shift_matrix(a, d_model, dtype=F64), shift_matrix(b, d_model, dtype=F64)
    torch.testing.assert_close(r_a @ r_b, shift_matrix(a + b, d_model, dtype=F64), rtol=0, atol=1e-10)
    torch.testing.assert_close(r_a.T @ r_a, torch.eye(d_model, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(shift_matrix(-a, d_model, dtype=F64), r_a.T, rtol=0, atol=1e-12)
    outside_blocks = torch.arange(d_model)[:, None] // 2 != torch.arange(d_model)[None, :] // 2
    assert (r_a[outside_blocks] == 0).all()


@settings(max_examples=30, deadline=None)
@given(d_model=even_dims, p=st.integers(0, 500), k=st.integers(-500, 500))
def test_dot_product_depends_only_on_offset(d_model: int, p: int, k: int) -> None:
    if p + k < 0:
        p = -k
    table = sinusoidal_encoding(p + abs(k) + 1, d_model, dtype=F64)
    expected = sum(math.cos(k / 10000.0 ** (2 * i / d_model)) for i in range(d_model // 2))
    assert float(table[p] @ table[p + k]) == pytest.approx(expected, abs=1e-9)


def test_sinusoidal_module_adds_the_table() -> None:
    x = torch.randn(2, 5, 6, dtype=F64)
    torch.testing.assert_close(SinusoidalPositionalEncoding(6, 100.0)(x),
                               x + torch.from_numpy(paper_table(5, 6, 100.0)))


# --------------------------------------------------------------------------- bits, learned

@pytest.mark.parametrize("num_positions, num_bits", [(16, 4), (5, 3), (1, 1), (3, 70)])
def test_binary_encoding_matches_python_bits(num_positions: int, num_bits: int) -> None:
    ours = binary_encoding(num_positions, num_bits, dtype=F64)
    for p in range(num_positions):
        expected = [int(c) for c in reversed(format(p, f"0{num_bits}b"))]  # least significant first
        assert ours[p].tolist() == expected
    assert torch.equal(binary_encoding(num_positions, num_bits, dtype=torch.int64), ours.long())


def test_learned_embedding_adds_its_rows_and_is_seeded() -> None:
    make = lambda seed: LearnedPositionalEmbedding(8, 4, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    emb = make(0)
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(emb(x), x + emb.weight[:5])
    assert torch.equal(make(0).weight, emb.weight) and not torch.equal(make(1).weight, emb.weight)
    assert 0.01 < float(emb.weight.detach().std()) < 0.04
    with pytest.raises(ValueError, match="exceeds max_positions=8"):
        emb(torch.randn(1, 9, 4))


@pytest.mark.parametrize("max_positions", [1, 2, 8, 33])
def test_learned_embedding_accepts_exactly_max_positions(max_positions: int) -> None:
    """The boundary: a sequence of exactly max_positions tokens uses every row; one more fails."""
    emb = LearnedPositionalEmbedding(max_positions, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, max_positions, 4)
    torch.testing.assert_close(emb(x), x + emb.weight)
    with pytest.raises(ValueError, match=f"length {max_positions + 1} exceeds max_positions={max_positions}"):
        emb(torch.randn(2, max_positions + 1, 4))


# --------------------------------------------------------------------------- RoPE

@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_rotate_half_matches_hf_llama(base: float) -> None:
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                                      rope_parameters={"rope_type": "default", "rope_theta": base})
    q, k = torch.randn(2, 2, 50, 32), torch.randn(2, 2, 50, 32)
    position_ids = torch.stack((torch.arange(50), torch.arange(50) + 13))  # per-sequence positions
    cos, sin = LlamaRotaryEmbedding(config)(q, position_ids)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_positions = position_ids[:, None, :]  # (batch, 1, t): broadcasts over heads
    torch.testing.assert_close(apply_rope(q, ours_positions, base), hf_q, rtol=0, atol=5e-5)
    torch.testing.assert_close(apply_rope(k, ours_positions, base), hf_k, rtol=0, atol=5e-5)


def test_rope_interleaved_matches_complex_rotation() -> None:
    """RoFormer's formulation: pair (x_2j, x_2j+1) is the complex number x_2j + i x_2j+1, times e^(i p w_j)."""
    x = torch.randn(3, 10, 8, dtype=F64)
    positions = torch.tensor([0, 1, 2, 5, 8, 13, 21, 34, 55, 1000])
    ours = apply_rope(x, positions, 100.0, interleaved=True)
    for b in range(3):
        for t, p in enumerate(positions.tolist()):
            for j in range(4):
                z = complex(x[b, t, 2 * j], x[b, t, 2 * j + 1]) * cmath.exp(1j * p * 100.0 ** (-2 * j / 8))
                assert (float(ours[b, t, 2 * j]), float(ours[b, t, 2 * j + 1])) == pytest.approx((z.real, z.imag))


@settings(max_examples=40, deadline=None)
@given(d=even_dims, m=st.integers(0, 3000), n=st.integers(0, 3000), shift=st.integers(-3000, 3000),
       interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_offset(d: int, m: int, n: int, shift: int, interleaved: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(d, dtype=F64, generator=gen), torch.randn(d, dtype=F64, generator=gen)
    rope = lambda x, p: apply_rope(x[None], torch.tensor([p]), interleaved=interleaved)[0]  # noqa: E731
    score = rope(q, m) @ rope(k, n)
    assert float(score) == pytest.approx(float(rope(q, m + shift) @ rope(k, n + shift)), abs=1e-9)
    assert float(score) == pytest.approx(float(q @ rope(k, n - m)), abs=1e-9)
    assert float(rope(q, m).norm()) == pytest.approx(float(q.norm()))


@settings(max_examples=20, deadline=None)
@given(d=even_dims, t=st.integers(1, 20))
def test_rope_layouts_differ_by_a_permutation(d: int, t: int) -> None:
    """Rotate-half pairs (j, j + d/2); interleaved pairs (2j, 2j+1): same rotation, dims reordered."""
    x = torch.randn(2, t, d, dtype=F64)
    to_halves = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
    positions = torch.arange(t) * 7
    torch.testing.assert_close(apply_rope(x[..., to_halves], positions),
                               apply_rope(x, positions, interleaved=True)[..., to_halves])


def test_interleaved_rope_is_the_inverse_shift_matrix() -> None:
    x = torch.randn(4, 16, dtype=F64)
    for p in (0, 3, 250):
        torch.testing.assert_close(apply_rope(x, torch.full((4,), p), interleaved=True),
                                   x @ shift_matrix(-p, 16, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rope_keeps_dtype_and_shape(dtype: torch.dtype) -> None:
    x = torch.randn(2, 3, 5, 8).to(dtype)
    out = apply_rope(x, torch.arange(5))
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.double(), apply_rope(x.double(), torch.arange(5)), rtol=0.02, atol=0.02)


# --------------------------------------------------------------------------- ALiBi

def reference_get_slopes(n: int) -> list[float]:
    """The rule of the ALiBi repository (ofirpress/attention_with_linear_biases), written out."""
    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + reference_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


@pytest.mark.parametrize("num_heads", range(1, 70))
def test_alibi_slopes_match_reference_rule(num_heads: int) -> None:
    np.testing.assert_allclose(alibi_slopes(num_heads, dtype=F64).numpy(), reference_get_slopes(num_heads),
                               rtol=1e-13)


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32])
def test_alibi_slopes_power_of_two_are_geometric(num_heads: int) -> None:
    slopes = alibi_slopes(num_heads, dtype=F64)
    assert float(slopes[0]) == pytest.approx(2 ** (-8 / num_heads))
    torch.testing.assert_close(slopes[1:] / slopes[:-1], torch.full((num_heads - 1,), slopes[0].item(), dtype=F64))
    assert float(slopes[-1]) == pytest.approx(2**-8)


def test_alibi_slopes_examples_from_the_paper() -> None:
    assert alibi_slopes(8, dtype=F64).tolist() == [2.0**-h for h in range(1, 9)]
    assert alibi_slopes(16, dtype=F64).tolist() == pytest.approx([2 ** (-h / 2) for h in range(1, 17)])


@pytest.mark.parametrize("num_heads", [3, 8, 12, 20])
def test_alibi_matches_bloom_under_a_causal_softmax(num_heads: int) -> None:
    """BLOOM adds m_h * j instead of -m_h * (i - j): the two differ by m_h * i, a constant per
    row, so softmax over the allowed keys (j <= i) is the same."""
    t = 10
    bias = alibi_bias(num_heads, t, t)
    bloom = build_alibi_tensor(torch.ones(1, t), num_heads, torch.float32).reshape(num_heads, 1, t)
    torch.testing.assert_close(bloom[:, 0, 1], alibi_slopes(num_heads))  # key 1's bias is the slope
    scores = torch.randn(num_heads, t, t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    ours = (scores + bias).masked_fill(~causal, float("-inf")).softmax(-1)
    theirs = (scores + bloom).masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(ours, theirs)


def test_alibi_bias_entries() -> None:
    bias = alibi_bias(4, 3, 5, dtype=F64)
    slopes = reference_get_slopes(4)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert float(bias[h, i, j]) == pytest.approx(-slopes[h] * abs(i - j))


# --------------------------------------------------------------------------- T5

@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (4, 3), (33, 128), (64, 1000), (6, 7)])
def test_t5_buckets_match_hf(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    offsets = torch.arange(-3000, 3001)
    ours = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert ours.dtype == torch.int64 and int(ours.min()) >= 0 and int(ours.max()) < num_buckets


@settings(max_examples=40, deadline=None)
@given(bidirectional=st.booleans(), num_buckets=st.integers(4, 80), max_distance=st.integers(41, 2000),
       offsets=st.lists(st.integers(-5000, 5000), min_size=1, max_size=50))
def test_t5_buckets_match_hf_property(bidirectional: bool, num_buckets: int, max_distance: int,
                                      offsets: list[int]) -> None:
    rel = torch.tensor(offsets).reshape(-1, 1)  # shape is kept
    ours = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance))


def test_t5_bucket_structure() -> None:
    offsets = torch.arange(-200, 201)
    buckets = t5_relative_position_bucket(offsets)
    past, future = buckets[:200].flip(0), buckets[201:]  # distances 1..200 to the left / right
    assert past[:7].tolist() == list(range(1, 8)) and future[:7].tolist() == list(range(17, 24))
    assert (past.diff() >= 0).all() and (future.diff() >= 0).all()
    assert (past[127:] == 15).all() and (future[127:] == 31).all()  # one shared bucket from 128 on


@pytest.mark.parametrize("is_decoder", [False, True])
def test_relative_position_bias_matches_hf_t5(is_decoder: bool) -> None:
    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=32,
                                   relative_attention_max_distance=128, is_decoder=is_decoder)
    hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    ours = RelativePositionBias(3, 32, 128, bidirectional=not is_decoder, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(ours.bias.weight)
    for t_q, t_k in ((5, 9), (200, 7), (1, 300)):
        torch.testing.assert_close(ours(t_q, t_k), hf.compute_bias(t_q, t_k)[0])


def test_relative_positions() -> None:
    assert relative_positions(2, 3).tolist() == [[0, 1, 2], [-1, 0, 1]]


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("call, error, message", [
    (lambda: sinusoidal_encoding(4, 7), ValueError, "d_model must be even"),
    (lambda: sinusoidal_encoding(4, 0), ValueError, "d_model must be positive"),
    (lambda: sinusoidal_encoding(-1, 8), ValueError, "num_positions must be >= 0"),
    (lambda: sinusoidal_encoding(4.0, 8), TypeError, "num_positions must be an int"),
    (lambda: sinusoidal_encoding(4, 8, base=1.0), ValueError, "base must be a finite number > 1"),
    (lambda: sinusoidal_encoding(4, 8, dtype=torch.int64), TypeError, "floating dtype"),
    (lambda: shift_matrix(1, 5), ValueError, "d_model must be even"),
    (lambda: shift_matrix("1", 4), TypeError, "k must be a real number"),
    (lambda: shift_matrix(float("nan"), 4), ValueError, "k must be finite"),
    (lambda: sinusoidal_encoding(4, 8, dtype="float32"), TypeError, "dtype must be a torch.dtype"),
    (lambda: binary_encoding(4, 3, dtype="int64"), TypeError, "dtype must be a torch.dtype"),
    (lambda: SinusoidalPositionalEncoding(3), ValueError, "d_model must be even"),
    (lambda: SinusoidalPositionalEncoding(4)(torch.randn(2, 3, 6)), ValueError, r"\(batch, t, d_model=4\)"),
    (lambda: binary_encoding(17, 4), ValueError, "17 positions need 5 bits but num_bits=4"),
    (lambda: binary_encoding(4, 0), ValueError, "num_bits must be positive"),
    (lambda: LearnedPositionalEmbedding(0, 4), ValueError, "max_positions must be positive"),
    (lambda: LearnedPositionalEmbedding(4, 4)(torch.ones(2, 3, 4, dtype=torch.long)), TypeError, "floating"),
    (lambda: apply_rope(torch.randn(2, 3, 5), torch.arange(3)), ValueError, "last dim d must be even"),
    (lambda: apply_rope(torch.randn(2, 3, 4), torch.arange(4)), ValueError, r"does not broadcast to x.shape\[:-1\]"),
    (lambda: apply_rope(torch.randn(2, 3, 4), torch.zeros(5, 2, 3)), ValueError, "does not broadcast"),
    (lambda: apply_rope(torch.ones(3, 4, dtype=torch.long), torch.arange(3)), TypeError, "floating dtype"),
    (lambda: apply_rope(torch.randn(3, 4), torch.ones(3, dtype=torch.bool)), TypeError, "positions must hold"),
    (lambda: apply_rope([[1.0, 0.0]], torch.arange(1)), TypeError, "x must be a torch.Tensor, got list"),
    (lambda: apply_rope(torch.randn(3, 4), [0, 1, 2]), TypeError, "positions must be a torch.Tensor, got list"),
    (lambda: apply_rope(torch.randn(4), torch.arange(1)), ValueError, r"shape \(\.\.\., t, d\)"),
    (lambda: alibi_slopes(0), ValueError, "num_heads must be positive"),
    (lambda: alibi_bias(2, -1, 3), ValueError, "t_q must be >= 0"),
    (lambda: t5_relative_position_bucket(torch.zeros(3)), TypeError, "integer tensor"),
    (lambda: t5_relative_position_bucket(torch.zeros(3, dtype=torch.long), num_buckets=3), ValueError,
     "num_buckets must be >= 4"),
    (lambda: t5_relative_position_bucket(torch.zeros(3, dtype=torch.long), max_distance=8), ValueError,
     "max_distance must exceed the 8"),
    (lambda: RelativePositionBias(2, num_buckets=1, bidirectional=False), ValueError, "num_buckets must be >= 2"),
])
def test_errors_name_the_argument(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


@pytest.mark.gpu
def test_cuda_follows_inputs() -> None:
    x = torch.randn(2, 4, 16, 8, device="cuda", dtype=torch.float16)
    out = apply_rope(x, torch.arange(16, device="cuda"))
    assert out.device.type == "cuda" and out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().double(), apply_rope(x.cpu().double(), torch.arange(16)), atol=0.02, rtol=0.02)
    torch.testing.assert_close(sinusoidal_encoding(100, 8, device="cuda").cpu(), sinusoidal_encoding(100, 8))
    assert alibi_bias(4, 3, 3, device="cuda").device.type == "cuda"
    rel = RelativePositionBias(2).cuda()
    assert rel(5, 5).device.type == "cuda"
