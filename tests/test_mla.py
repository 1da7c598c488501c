"""Tests for lecture_pkg.mla: MLA equals Hugging Face's DeepseekV3Attention on small random
configs (built offline from a config), absorbed decoding equals the expanded form, the cache
holds kv_lora_rank + qk_rope_head_dim numbers per token, and the cache-size formula."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.mla import MLACache, MultiHeadLatentAttention, kv_cache_bytes_per_token

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)


def hf_layer(q_lora_rank, rope_interleave, seed=0):
    config = DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
        q_lora_rank=q_lora_rank, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        rope_interleave=rope_interleave, num_hidden_layers=1, vocab_size=100,
        intermediate_size=64, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    layer = DeepseekV3Attention(config, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():  # norms too, so a weight mix-up would show
            p.normal_(0.0, 0.2)
    return config, layer


def hf_output(config, layer, x):
    t = x.shape[1]
    cos, sin = DeepseekV3RotaryEmbedding(config)(x, torch.arange(t)[None].expand(x.shape[0], -1))
    mask = torch.full((t, t), torch.finfo(x.dtype).min).triu(1)[None, None]
    return layer(x, (cos, sin), mask)[0]


@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("rope_interleave", [False, True])
def test_mla_equals_hugging_face_deepseek_v3(q_lora_rank, rope_interleave):
    config, layer = hf_layer(q_lora_rank, rope_interleave)
    x = torch.randn(2, 11, 64, generator=torch.Generator().manual_seed(1))
    expected = hf_output(config, layer, x)
    ours = MultiHeadLatentAttention.from_hf(layer)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(x, mode="absorb"), expected, rtol=1e-5, atol=1e-5)
        # decode in pieces through the latent cache: prefill, then absorbed steps
        cache = MLACache()
        pieces = [ours(x[:, :5], cache=cache)]
        pieces += [ours(x[:, t:t + 1], cache=cache, mode="absorb") for t in range(5, 11)]
        torch.testing.assert_close(torch.cat(pieces, 1), expected, rtol=1e-5, atol=1e-5)
    assert cache.latent.shape == (2, 11, 16) and cache.k_rope.shape == (2, 11, 8)
    assert cache.numel_per_token() == 16 + 8


def test_absorbed_equals_expanded_in_float64():
    torch.manual_seed(0)
    layer = MultiHeadLatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6,
                                     qk_rope_head_dim=4, v_head_dim=5).double()
    x = torch.randn(3, 9, 32, dtype=torch.float64)
    torch.testing.assert_close(layer(x, mode="absorb"), layer(x), rtol=0, atol=1e-12)


def test_kv_cache_bytes_per_token_deepseek_v3_shape():
    shape = {"num_layers": 61, "num_heads": 128, "head_dim": 128, "bytes_per_element": 2}
    mha = kv_cache_bytes_per_token("MHA", **shape)
    assert mha == 2 * 128 * 128 * 61 * 2
    assert kv_cache_bytes_per_token("GQA", num_kv_heads=8, **shape) == mha // 16
    assert kv_cache_bytes_per_token("MQA", **shape) == mha // 128
    mla = kv_cache_bytes_per_token("MLA", kv_lora_rank=512, qk_rope_head_dim=64, **shape)
    assert mla == 576 * 61 * 2  # DeepSeek-V2: as much as GQA with 2.25 groups
    assert mla / kv_cache_bytes_per_token("GQA", num_kv_heads=1, **shape) == 2.25


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MultiHeadLatentAttention(32, 4, 8, 6, 3, 5)
    with pytest.raises(ValueError, match="kv_lora_rank must be positive"):
        MultiHeadLatentAttention(32, 4, 0, 6, 4, 5)
    layer = MultiHeadLatentAttention(32, 4, 8, 6, 4, 5)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, t, hidden_size=32\)"):
        layer(torch.zeros(1, 3, 31))
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        kv_cache_bytes_per_token("GQA", num_layers=1, num_heads=4, head_dim=2, num_kv_heads=3)
    with pytest.raises(ValueError, match="MLA needs kv_lora_rank"):
        kv_cache_bytes_per_token("MLA", num_layers=1, num_heads=4, head_dim=2)
