"""Tests for lecture_pkg.masks: every mask against explicit loops, attention with the masks against
torch's SDPA, BERT's corruption against HF transformers' collator, T5's spans against NumPy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.masks import (
    IGNORE_INDEX,
    T5_SENTINELS,
    apply_span_corruption,
    bigbird_mask,
    broadcast_mask,
    causal_mask,
    combine_masks,
    document_mask,
    longformer_mask,
    mlm_mask,
    packed_document_ids,
    padding_mask,
    position_ids,
    prefix_lm_mask,
    random_spans,
    sliding_window_mask,
    span_corruption,
    to_additive_mask,
)

sizes = st.integers(min_value=1, max_value=12)


def loop_mask(t_q: int, t_k: int, allowed) -> torch.Tensor:
    """Reference: a mask filled one (i, j) pair at a time from a predicate."""
    return torch.tensor([[bool(allowed(i, j)) for j in range(t_k)] for i in range(t_q)],
                        dtype=torch.bool).reshape(t_q, t_k)


# --- masks against loops ------------------------------------------------------------------------

@given(t_q=sizes, t_k=sizes)
def test_causal_mask_matches_loops(t_q: int, t_k: int) -> None:
    assert torch.equal(causal_mask(t_q, t_k), loop_mask(t_q, t_k, lambda i, j: j <= i))


def test_causal_mask_small_exact() -> None:
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3), expected)


@given(t=sizes, window=st.integers(0, 12), causal=st.booleans())
def test_sliding_window_matches_loops(t: int, window: int, causal: bool) -> None:
    expected = loop_mask(t, t, lambda i, j: abs(i - j) <= window and (j <= i or not causal))
    assert torch.equal(sliding_window_mask(t, window, causal=causal), expected)


@given(t=sizes, window=st.integers(0, 4), data=st.data())
def test_longformer_matches_loops(t: int, window: int, data: st.DataObject) -> None:
    global_tokens = data.draw(st.sets(st.integers(0, t - 1), max_size=3))
    expected = loop_mask(t, t, lambda i, j: abs(i - j) <= window or i in global_tokens
                         or j in global_tokens)
    assert torch.equal(longformer_mask(t, window, global_tokens), expected)


@given(t=sizes, data=st.data())
def test_prefix_lm_matches_loops(t: int, data: st.DataObject) -> None:
    prefix = data.draw(st.integers(0, t))
    expected = loop_mask(t, t, lambda i, j: j <= i or j < prefix)
    assert torch.equal(prefix_lm_mask(t, prefix), expected)
    assert torch.equal(prefix_lm_mask(t, 0), causal_mask(t))
    assert prefix_lm_mask(t, t).all()


def test_padding_mask_matches_loops() -> None:
    lengths = [3, 0, 5, 1]
    expected = loop_mask(4, 6, lambda b, j: j < lengths[b])
    assert torch.equal(padding_mask(torch.tensor(lengths), 6), expected)
    assert padding_mask(lengths).shape == (4, 5)  # max_len defaults to the longest


def test_bigbird_adds_exactly_num_random_unseen_keys_per_row() -> None:
    t, window, global_tokens, r = 24, 2, [0, 5], 3
    base = longformer_mask(t, window, global_tokens)
    mask = bigbird_mask(t, window, global_tokens, r, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mask & base, base)  # keeps the window and the globals
    extra = (mask & ~base).sum(-1)
    unseen = (~base).sum(-1)
    assert torch.equal(extra, unseen.clamp(max=r))


def test_bigbird_is_reproducible_and_uniform() -> None:
    t, r, draws = 10, 2, 3000
    g = torch.Generator().manual_seed(1)
    first = bigbird_mask(t, 1, (), r, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, bigbird_mask(t, 1, (), r, generator=torch.Generator().manual_seed(7)))
    counts = sum(bigbird_mask(t, 1, (), r, generator=g)[0].int() for _ in range(draws))
    # row 0 sees keys {0, 1}; each of the 8 others is picked with probability 2/8
    freq = counts[2:].double() / draws
    assert torch.allclose(freq, torch.full_like(freq, r / 8), atol=0.04), freq


# --- broadcasting and combining -----------------------------------------------------------------

def test_combine_masks_is_elementwise_and() -> None:
    lengths = [2, 4, 3]
    combined = combine_masks(causal_mask(4), padding_mask(lengths, 4)[:, None, None, :])
    assert combined.shape == (3, 1, 4, 4)
    for b in range(3):
        expected = loop_mask(4, 4, lambda i, j: j <= i and j < lengths[b])
        assert torch.equal(combined[b, 0], expected)


def test_broadcast_mask_shapes_and_errors() -> None:
    mask = causal_mask(3, 5)
    out = broadcast_mask(mask, (2, 4, 3, 5))
    assert out.shape == (2, 4, 3, 5) and torch.equal(out[1, 3], mask)
    with pytest.raises(ValueError, match="t_k = 5 but the scores have t_k = 6"):
        broadcast_mask(mask, (2, 4, 3, 6))
    with pytest.raises(ValueError, match=r"\(batch, heads, t_q, t_k\)"):
        broadcast_mask(torch.ones(3, dtype=torch.bool), (1, 1, 1, 3))
    with pytest.raises(TypeError, match="bool tensor"):
        broadcast_mask(mask.float(), (1, 1, 3, 5))
    with pytest.raises(ValueError, match="do not broadcast"):
        combine_masks(causal_mask(3), causal_mask(4))


# --- masks inside attention (torch SDPA as the reference) ---------------------------------------

@settings(deadline=None, max_examples=30)
@given(t_q=sizes, t_k=sizes, batch=st.integers(1, 3), heads=st.integers(1, 3))
def test_causal_mask_equals_sdpa_is_causal(t_q: int, t_k: int, batch: int, heads: int) -> None:
    g = torch.Generator().manual_seed(t_q * 100 + t_k)
    q, k, v = (torch.randn(batch, heads, t, 8, generator=g, dtype=torch.float64)
               for t in (t_q, t_k, t_k))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, t_k))
    additive = F.scaled_dot_product_attention(
        q, k, v, attn_mask=to_additive_mask(causal_mask(t_q, t_k), q.dtype))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(additive, expected)


def test_causal_mask_stops_leakage_from_the_future() -> None:
    t, d = 6, 8
    x = torch.randn(1, 1, t, d, dtype=torch.float64, requires_grad=True)
    for mask, leaks in ((None, True), (causal_mask(t), False)):
        out = F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
        for pos in range(t - 1):
            (grad,) = torch.autograd.grad(out[0, 0, pos].sum(), x, retain_graph=True)
            future = grad[0, 0, pos + 1:].abs().max().item()
            assert (future > 1e-6) == leaks, (pos, future)


def test_padding_does_not_change_the_real_tokens() -> None:
    # Bidirectional attention, so that only the padding mask keeps the pads out (a causal mask
    # alone would already hide right padding). The sequence shares its batch with a longer one.
    g = torch.Generator().manual_seed(0)
    seq = torch.randn(5, 8, generator=g, dtype=torch.float64)
    alone = F.scaled_dot_product_attention(seq[None], seq[None], seq[None])
    for pad in (1, 4, 11):
        padded = torch.cat([seq, torch.randn(pad, 8, generator=g, dtype=torch.float64)])
        batch = torch.stack([padded, torch.randn(5 + pad, 8, generator=g, dtype=torch.float64)])
        keys = padding_mask([5, 5 + pad])[:, None, :]  # (batch, 1, t_k): same for every query
        out = F.scaled_dot_product_attention(batch, batch, batch, attn_mask=keys)
        torch.testing.assert_close(out[:1, :5], alone, rtol=0, atol=1e-12)
        unmasked = F.scaled_dot_product_attention(batch, batch, batch)
        assert (unmasked[:1, :5] - alone).abs().max() > 1e-3  # the pads leak without the mask


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_additive_mask_is_safe_in_low_precision(dtype: torch.dtype) -> None:
    scores = torch.randn(4, 4).to(dtype) * 100
    additive = to_additive_mask(causal_mask(4), dtype)
    assert additive.dtype == dtype and torch.isfinite(additive).all()
    weights = (scores + additive).float().softmax(-1)
    assert torch.isfinite(weights).all()
    assert weights.triu(1).abs().max() == 0  # blocked keys get exactly zero weight
    # the classic -1e9 does not even exist in fp16: it rounds to -inf
    assert torch.tensor(-1e9, dtype=torch.float16).isinf()


# --- BERT's masked-LM corruption ----------------------------------------------------------------

class _StubTokenizer:
    """Just enough of a tokenizer for HF's DataCollatorForLanguageModeling (no hub, no files)."""

    mask_token, pad_token, pad_token_id, is_fast = "[MASK]", "[PAD]", 0, True

    def __init__(self, vocab_size: int, mask_token_id: int) -> None:
        self.vocab_size, self.mask_token_id = vocab_size, mask_token_id

    def __len__(self) -> int:
        return self.vocab_size

    def convert_tokens_to_ids(self, token: str) -> int:
        assert token == self.mask_token
        return self.mask_token_id


def _batch(vocab: int, shape: tuple[int, int], seed: int) -> torch.Tensor:
    ids = torch.randint(4, vocab, shape, generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, -1] = 1, 2  # [CLS] ... [SEP]
    ids[0, -5:] = 0  # some padding
    return ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mlm_mask_equals_hf_collator(seed: int) -> None:
    from transformers import DataCollatorForLanguageModeling

    vocab, mask_id, specials = 500, 3, (0, 1, 2)
    ids = _batch(vocab, (8, 64), seed)
    collator = DataCollatorForLanguageModeling(tokenizer=_StubTokenizer(vocab, mask_id))
    collator.generator = torch.Generator().manual_seed(seed)
    hf_inputs, hf_labels = collator.torch_mask_tokens(ids.clone(),
                                                      special_tokens_mask=torch.isin(ids, torch.tensor(specials)))
    inputs, labels = mlm_mask(ids, vocab, mask_id, specials,
                              generator=torch.Generator().manual_seed(seed))
    assert torch.equal(inputs, hf_inputs) and torch.equal(labels, hf_labels)


def test_mlm_statistics_on_a_large_batch() -> None:
    vocab, mask_id, specials = 30_000, 3, (0, 1, 2)
    ids = _batch(vocab, (256, 512), 0)
    before = ids.clone()
    inputs, labels = mlm_mask(ids, vocab, mask_id, specials,
                              generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, before)  # not modified in place
    special = torch.isin(ids, torch.tensor(specials))
    selected = labels != IGNORE_INDEX
    assert not (selected & special).any() and torch.equal(inputs[special], ids[special])
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])  # unselected tokens are untouched
    rate = selected.sum() / (~special).sum()
    n = selected.sum()
    as_mask = (inputs[selected] == mask_id).sum() / n
    unchanged = (inputs[selected] == ids[selected]).sum() / n
    randomised = 1 - as_mask - unchanged
    assert abs(rate - 0.15) < 0.005, rate  # about 6 standard errors
    assert abs(as_mask - 0.8) < 0.015 and abs(unchanged - 0.1) < 0.012 \
        and abs(randomised - 0.1) < 0.012, (as_mask, unchanged, randomised)
    # random replacements are uniform over the vocabulary: mean id close to (vocab - 1) / 2
    replaced = inputs[selected & (inputs != mask_id) & (inputs != ids)].double()
    assert abs(replaced.mean() / (vocab - 1) - 0.5) < 0.03


def test_mlm_is_reproducible_and_validates() -> None:
    ids = _batch(100, (4, 16), 3)
    a = mlm_mask(ids, 100, 3, generator=torch.Generator().manual_seed(9))
    b = mlm_mask(ids, 100, 3, generator=torch.Generator().manual_seed(9))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(TypeError, match="integer tensor"):
        mlm_mask(ids.float(), 100, 3)
    with pytest.raises(ValueError, match="mask_token_id"):
        mlm_mask(ids, 100, 100)
    with pytest.raises(ValueError, match="mlm_probability"):
        mlm_mask(ids, 100, 3, mlm_probability=1.5)
    with pytest.raises(ValueError, match="vocab_size=50"):
        mlm_mask(ids, 50, 3)


# --- T5's span corruption -----------------------------------------------------------------------

def merge_span_corruption(inputs: list, targets: list, sentinels) -> list:
    """Reference inverse: put every span of ``targets`` back in place of its sentinel."""
    sentinel_set = set(sentinels)
    filling, current = {}, None
    for token in targets:
        if token in sentinel_set:
            current = filling.setdefault(token, [])
        else:
            current.append(token)
    return [tok for token in inputs for tok in (filling[token] if token in sentinel_set else [token])]


def test_t5_slides_example() -> None:
    tokens = "Thank you for inviting me to your party last week .".split()
    inputs, targets = apply_span_corruption(tokens, [(2, 4), (8, 9)], ["<X>", "<Y>", "<Z>"])
    assert " ".join(inputs) == "Thank you <X> me to your party <Y> week ."
    assert " ".join(targets) == "<X> for inviting <Y> last <Z>"


@given(n=st.integers(0, 30), data=st.data())
def test_apply_span_corruption_round_trips(n: int, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, n), max_size=8)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2])]  # disjoint, sorted, non-empty
    tokens = list(range(1000, 1000 + n))
    inputs, targets = apply_span_corruption(tokens, spans)
    assert inputs.count(T5_SENTINELS[0]) == (1 if spans else 0)
    ends_kept = (spans[-1][1] if spans else 0) < n  # only then a closing sentinel
    assert len(inputs) + len(targets) == n + 2 * len(spans) + ends_kept
    assert merge_span_corruption(inputs, targets, T5_SENTINELS) == tokens


def test_apply_span_corruption_accepts_a_tensor() -> None:
    inputs, targets = apply_span_corruption(torch.arange(5), [(1, 3)], [-1, -2])
    assert inputs == [0, -1, 3, 4] and targets == [-1, 1, 2, -2]


def test_random_spans_counts_match_t5_formula() -> None:
    g = torch.Generator().manual_seed(0)
    for length in (2, 3, 7, 20, 64, 113, 512):
        for density, mean in ((0.15, 3.0), (0.5, 2.0), (0.3, 8.0)):
            spans = random_spans(length, density, mean, generator=g)
            # the same numbers computed as T5's preprocessor does, with NumPy's rounding
            noise = int(min(max(np.round(length * density), 1), length - 1))
            count = int(min(max(np.round(noise / mean), 1), length - noise))
            assert sum(b - a for a, b in spans) == noise and len(spans) == count
            assert spans[0][0] > 0 and spans[-1][1] == length  # kept first, a span last
            assert all(a < b < c for (a, b), (c, _) in zip(spans, spans[1:]))  # gaps between


@pytest.mark.parametrize("length", [2, 3, 4, 5, 10, 17, 64])
@pytest.mark.parametrize("density", [0.01, 0.1, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("mean", [1.0, 1.5, 3.0, 10.0, 100.0])
def test_random_spans_counts_at_extreme_settings(length: int, density: float, mean: float) -> None:
    """The noise count is round(length * density), clipped to [1, length - 1], whatever the span
    length: at high density with short spans there are fewer kept tokens than wanted spans, and
    the number of spans must give way (at most one span per kept run), not the noise count."""
    noise = min(max(round(length * density), 1), length - 1)
    wanted_spans = max(round(noise / mean), 1)
    for seed in range(3):
        spans = random_spans(length, density, mean, generator=torch.Generator().manual_seed(seed))
        assert sum(b - a for a, b in spans) == noise, spans
        assert len(spans) == min(wanted_spans, length - noise), spans
        assert spans[0][0] >= 1 and spans[-1][1] == length          # a kept run first, a span last
        assert all(a < b for a, b in spans)                          # no empty span
        assert all(b < c for (_, b), (c, _) in zip(spans, spans[1:]))  # a kept run between spans


def test_random_spans_high_density_short_spans_example() -> None:
    # 9 noise tokens wanted, 9 spans of length 1 would need 9 kept tokens between them: only 1 is
    # left, so all 9 noise tokens form one span after it
    assert random_spans(10, 0.9, 1.0, generator=torch.Generator().manual_seed(0)) == [(1, 10)]
    spans = random_spans(10, 0.6, 1.0, generator=torch.Generator().manual_seed(0))
    assert sum(b - a for a, b in spans) == 6 and len(spans) == 4


def test_span_corruption_density_and_mean_length_over_many_samples() -> None:
    g = torch.Generator().manual_seed(0)
    noise = spans = total = 0
    for length in torch.randint(20, 400, (300,), generator=torch.Generator().manual_seed(1)):
        tokens = list(range(int(length)))
        inputs, targets = span_corruption(tokens, generator=g)
        assert merge_span_corruption(inputs, targets, T5_SENTINELS) == tokens
        n_spans = sum(tok in T5_SENTINELS for tok in inputs)
        assert targets[-1] not in T5_SENTINELS  # T5's draws end on a span: no closing sentinel
        noise, spans, total = noise + len(targets) - n_spans, spans + n_spans, total + len(tokens)
    assert abs(noise / total - 0.15) < 0.005 and abs(noise / spans - 3.0) < 0.15


def test_span_lengths_are_uniform_over_compositions() -> None:
    # 10 tokens, density 0.4, mean 2: 4 noise tokens in 2 spans, (1,3), (2,2), (3,1) equally likely
    g = torch.Generator().manual_seed(0)
    counts = Counter(tuple(b - a for a, b in random_spans(10, 0.4, 2.0, generator=g))
                     for _ in range(3000))
    assert set(counts) == {(1, 3), (2, 2), (3, 1)}
    assert all(abs(c / 3000 - 1 / 3) < 0.04 for c in counts.values()), counts


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="t_k must be >= 0"):
        causal_mask(3, -1)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        to_additive_mask(torch.ones(2, 2), torch.float16)
    with pytest.raises(TypeError, match="floating dtype"):
        to_additive_mask(causal_mask(2), torch.int64)
    with pytest.raises(ValueError, match="window must be >= 0"):
        sliding_window_mask(5, -1)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, max_len=4\]"):
        padding_mask([2, 5], 4)
    with pytest.raises(ValueError, match="1-D integer"):
        padding_mask(torch.ones(2, 2, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="global_tokens"):
        longformer_mask(5, 1, [5])
    with pytest.raises(ValueError, match="num_random"):
        bigbird_mask(5, 1, (), 6)
    with pytest.raises(ValueError, match="prefix_len"):
        prefix_lm_mask(5, 6)
    for density in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"noise_density must lie in \(0, 1\)"):
            span_corruption(list(range(10)), noise_density=density)
    with pytest.raises(ValueError, match="2 spans need 3 sentinels, got 2"):
        apply_span_corruption(list(range(10)), [(1, 2), (4, 6)], ["<X>", "<Y>"])
    with pytest.raises(ValueError, match="non-overlapping"):
        apply_span_corruption(list(range(10)), [(1, 5), (4, 6)])
    with pytest.raises(ValueError, match="non-overlapping"):
        apply_span_corruption(list(range(10)), [(3, 3)])
    with pytest.raises(ValueError, match="length must be >= 2"):
        span_corruption(["only"])


@pytest.mark.gpu
def test_masks_and_corruptions_follow_the_device() -> None:
    cuda = torch.device("cuda")
    lengths = torch.tensor([3, 5], device=cuda)
    built = [causal_mask(4, device=cuda), padding_mask(lengths), sliding_window_mask(6, 1, device=cuda),
             longformer_mask(6, 1, [0], device=cuda), prefix_lm_mask(6, 2, device=cuda),
             bigbird_mask(8, 1, [0], 2, generator=torch.Generator(cuda).manual_seed(0), device=cuda)]
    assert all(m.device.type == "cuda" and m.dtype == torch.bool for m in built)
    assert torch.equal(built[-1].cpu() & longformer_mask(8, 1, [0]), longformer_mask(8, 1, [0]))
    ids = _batch(100, (4, 32), 0).to(cuda)
    inputs, labels = mlm_mask(ids, 100, 3, (0, 1, 2), generator=torch.Generator(cuda).manual_seed(0))
    assert inputs.device.type == labels.device.type == "cuda"
    selected = labels != IGNORE_INDEX
    assert torch.equal(labels[selected], ids[selected]) and torch.equal(inputs[~selected], ids[~selected])
    spans = random_spans(50, generator=torch.Generator(cuda).manual_seed(0))
    assert sum(b - a for a, b in spans) == 8


def test_causal_mask_bottom_right_alignment() -> None:
    # 2 new queries after 3 cached positions: query i sees keys 0..3+i.
    mask = causal_mask(2, 5, align="bottom-right")
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert causal_mask(2, 5).tolist()[0] == [True, False, False, False, False]
    assert torch.equal(causal_mask(4, 4, align="bottom-right"), causal_mask(4, 4))
    with pytest.raises(ValueError, match="align"):
        causal_mask(2, 5, align="left")


# --- sequence packing and position ids ----------------------------------------------------------

@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5), extra=st.integers(0, 4),
       causal=st.booleans())
def test_document_mask_and_position_ids_match_loops(lengths: list[int], extra: int,
                                                    causal: bool) -> None:
    ids = packed_document_ids(lengths, sum(lengths) + extra)
    owner = [d for d, n in enumerate(lengths) for _ in range(n)] + [-1] * extra
    assert ids.tolist() == owner
    t = len(owner)
    expected = loop_mask(t, t, lambda i, j: owner[i] == owner[j] >= 0 and (j <= i or not causal))
    assert torch.equal(document_mask(ids, causal=causal), expected)
    starts = {d: owner.index(d) for d in set(owner) if d >= 0}
    assert position_ids(ids).tolist() == [i - starts[d] if d >= 0 else 0
                                          for i, d in enumerate(owner)]


def test_packed_attention_equals_each_document_alone() -> None:
    from lecture_pkg.attention import scaled_dot_product_attention
    g = torch.Generator().manual_seed(0)
    lengths, t = [3, 5, 2], 12
    ids = packed_document_ids(lengths, t)
    q, k, v = (torch.randn(2, t, 4, generator=g, dtype=torch.float64) for _ in range(3))
    packed, _ = scaled_dot_product_attention(q, k, v, attn_mask=document_mask(ids))
    start = 0
    for n in lengths:
        doc = slice(start, start + n)
        alone, _ = scaled_dot_product_attention(q[:, doc], k[:, doc], v[:, doc], is_causal=True)
        assert torch.allclose(packed[:, doc], alone, atol=1e-12)
        start += n
    assert (packed[:, start:] == 0).all()     # padding queries attend to nothing: zero rows
    # without the document mask, a plain causal mask lets document 1 read document 0
    leaky, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(leaky[:, 3:8], packed[:, 3:8])


def test_position_ids_under_left_padding_match_hf_formula() -> None:
    lengths = torch.tensor([2, 5, 0, 4])
    real = padding_mask(lengths, 6, side="left")
    assert real.tolist()[0] == [False] * 4 + [True] * 2
    ids = torch.where(real, 0, -1)                    # one document per row after the padding
    ours = position_ids(ids)
    # HF's generate: position_ids = attention_mask.cumsum(-1) - 1, padding filled with 1
    hf = (real.long().cumsum(-1) - 1).masked_fill(~real, 1)
    assert torch.equal(ours[real], hf[real]) and (ours[~real] == 0).all()
    assert ours[1].tolist() == [0, 0, 1, 2, 3, 4]
    assert torch.equal(padding_mask(lengths, 6, side="left"),
                       padding_mask(lengths, 6).flip(-1))


def test_packing_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="one contiguous run"):
        document_mask(torch.tensor([0, 1, 0]))
    with pytest.raises(TypeError, match="document_ids must be an integer tensor"):
        position_ids(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(t,\) or \(batch, t\)"):
        document_mask(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="do not fit in max_len=4"):
        packed_document_ids([3, 2], 4)
    with pytest.raises(ValueError, match="side must be"):
        padding_mask([1, 2], side="middle")


# --- T5's targets: one sentinel per run of kept tokens (t5.data.preprocessors) ----------------

def t5_targets_reference(tokens: list, noise: list[bool], sentinels) -> list:
    """T5's ``nonnoise_span_to_unique_sentinel`` in plain Python: every run of kept tokens becomes
    the next sentinel, noise tokens stay (written independently of lecture_pkg)."""
    out, k = [], 0
    for i, (token, is_noise) in enumerate(zip(tokens, noise)):
        if is_noise:
            out.append(token)
        elif i == 0 or noise[i - 1]:
            out.append(sentinels[k])
            k += 1
    return out


def test_span_corruption_targets_paper_example_ends_on_kept_word() -> None:
    # Raffel et al. (2020), figure 2: "last" is dropped and "week." is kept, so <Z> closes
    tokens = "Thank you for inviting me to your party last week.".split()
    inputs, targets = apply_span_corruption(tokens, [(2, 4), (8, 9)], ["<X>", "<Y>", "<Z>"])
    assert " ".join(inputs) == "Thank you <X> me to your party <Y> week."
    assert " ".join(targets) == "<X> for inviting <Y> last <Z>"
    noise = [i in (2, 3, 8) for i in range(len(tokens))]
    assert targets == t5_targets_reference(tokens, noise, ["<X>", "<Y>", "<Z>"])


def test_span_corruption_targets_text_ending_on_a_span() -> None:
    # drop "last week." instead: the text ends on a span, so the target ends with it (T5 then
    # appends </s>) and only two sentinels are needed
    tokens = "Thank you for inviting me to your party last week.".split()
    inputs, targets = apply_span_corruption(tokens, [(2, 4), (8, 10)], ["<X>", "<Y>"])
    assert " ".join(inputs) == "Thank you <X> me to your party <Y>"
    assert " ".join(targets) == "<X> for inviting <Y> last week."
    noise = [i in (2, 3, 8, 9) for i in range(len(tokens))]
    assert targets == t5_targets_reference(tokens, noise, ["<X>", "<Y>"])
    with pytest.raises(ValueError, match="2 spans need 3 sentinels"):
        apply_span_corruption(tokens, [(2, 4), (8, 9)], ["<X>", "<Y>"])


@given(n=st.integers(2, 60), seed=st.integers(0, 2**31 - 1))
def test_span_corruption_targets_equal_t5_rule(n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    spans = random_spans(n, 0.3, 2.0, generator=g)
    tokens = list(range(100, 100 + n))
    noise = [any(a <= i < b for a, b in spans) for i in range(n)]
    _, targets = apply_span_corruption(tokens, spans)
    assert targets == t5_targets_reference(tokens, noise, T5_SENTINELS)
