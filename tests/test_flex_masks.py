"""Tests for lecture_pkg.flex_masks and masks.sliding_window_causal_mask: FlexAttention
(torch.nn.attention.flex_attention, eager on the CPU) equals the package's dense masks and
masked attention; the decoder window equals Hugging Face's Mistral mask."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.attention import scaled_dot_product_attention
from lecture_pkg.flex_masks import (
    block_mask,
    causal_mod,
    dense_mask,
    document_mod,
    flex_masked_attention,
    prefix_lm_mod,
    sliding_window_mod,
)
from lecture_pkg.masks import (
    causal_mask,
    document_mask,
    packed_document_ids,
    prefix_lm_mask,
    sliding_window_causal_mask,
)

T = 96
IDS = packed_document_ids([30, 41, 15], T)  # ten padding positions at the end
CASES = {
    "causal": (causal_mod(), causal_mask(T)),
    "sliding": (sliding_window_mod(16), sliding_window_causal_mask(T, 16)),
    "sliding+sinks": (sliding_window_mod(16, num_sinks=4), sliding_window_causal_mask(T, 16, 4)),
    "prefix-lm": (prefix_lm_mod(20), prefix_lm_mask(T, 20)),
    "document": (document_mod(IDS), document_mask(IDS)),
    "document, bidirectional": (document_mod(IDS, causal=False), document_mask(IDS, causal=False)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flex_attention_equals_the_package_masks(name):
    mask_mod, mask = CASES[name]
    assert torch.equal(dense_mask(mask_mod, T), mask)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 8, generator=g) for _ in range(3))
    expected, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = flex_masked_attention(q, k, v, mask_mod, block_size=16)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_block_sparsity_counts_empty_tiles():
    blocks = block_mask(sliding_window_mod(16), T, block_size=16)  # 6 x 6 tiles
    # a 16-key window reaches the tile on the diagonal and the one before it: 6 + 5 of 36 tiles
    assert blocks.sparsity() == pytest.approx(100 * (1 - 11 / 36), abs=1e-6)
    assert block_mask(causal_mod(), T, block_size=16).sparsity() == pytest.approx(100 * 15 / 36)


@pytest.mark.parametrize("window", [1, 3, 8, 40])
def test_sliding_window_causal_mask_equals_hugging_face_mistral(window):
    transformers = pytest.importorskip("transformers")
    from transformers.masking_utils import create_sliding_window_causal_mask

    config = transformers.MistralConfig(sliding_window=window, hidden_size=16,
                                        num_attention_heads=2, num_key_value_heads=2,
                                        num_hidden_layers=1, vocab_size=10, intermediate_size=16)
    config._attn_implementation = "sdpa"
    t = 20
    hf = create_sliding_window_causal_mask(config, torch.zeros(1, t, 16),
                                           torch.ones(1, t, dtype=torch.long), None,
                                           position_ids=torch.arange(t)[None],
                                           allow_is_causal_skip=False)
    assert torch.equal(hf[0, 0], sliding_window_causal_mask(t, window))


def test_sinks_and_window_counts():
    mask = sliding_window_causal_mask(10, 3, num_sinks=2)
    assert mask[9].nonzero().flatten().tolist() == [0, 1, 7, 8, 9]
    assert torch.equal(sliding_window_causal_mask(10, 10), causal_mask(10))
    assert mask.sum(-1).max() == 3 + 2


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="window must be positive"):
        sliding_window_causal_mask(8, 0)
    with pytest.raises(ValueError, match="window must be positive"):
        sliding_window_mod(0)
    with pytest.raises(ValueError, match="document_ids must be a 1-D integer tensor"):
        document_mod(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="k has last dim 4 but q has 8"):
        flex_masked_attention(torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 4),
                              torch.zeros(1, 1, 4, 4), causal_mod())
