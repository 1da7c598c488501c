"""lecture_pkg.models.vit against transformers' ViTModel / ViTForImageClassification
(random-initialised small configurations), the patch embedding against unfold + linear, the
position options, and clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lecture_pkg.models.vit import PatchEmbedding, ViT, ViTConfig, patchify

transformers = pytest.importorskip("transformers")


def hf_config(**overrides: object) -> transformers.ViTConfig:
    sizes = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 3,
             "num_attention_heads": 4, "intermediate_size": 64, "num_labels": 5,
             "attn_implementation": "eager"}
    return transformers.ViTConfig(**{**sizes, **overrides})


def randomise(model: torch.nn.Module) -> None:
    """Move every parameter away from its initial value, so that no mapping error hides behind
    ones, zeros or a symmetric init."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))


@pytest.fixture(scope="module")
def hf_model() -> transformers.ViTModel:
    torch.manual_seed(0)
    model = transformers.ViTModel(hf_config()).eval()
    randomise(model)
    return model


def images(*size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*size, generator=torch.Generator().manual_seed(seed))


def test_patch_embedding_is_unfold_then_linear() -> None:
    torch.manual_seed(0)
    embed = PatchEmbedding(3, 8, patch_size=4)
    x = images(2, 3, 12, 8)
    patches = patchify(x, 4)
    assert patches.shape == (2, 6, 48)
    linear = patches @ embed.proj.weight.flatten(1).T + embed.proj.bias
    torch.testing.assert_close(embed(x), linear, rtol=0, atol=1e-5)
    # raster order: patch 1 is the top row's second patch, channel-first inside
    torch.testing.assert_close(patches[0, 1], x[0, :, 0:4, 4:8].reshape(-1))


def test_hidden_states_pooler_and_attentions_equal_hf(hf_model) -> None:
    ours = ViT.from_hf(hf_model).eval()
    x = images(2, 3, 16, 16)
    expected = hf_model(x, output_attentions=True)
    got = ours(x, output_attentions=True)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state,
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=0, atol=1e-5)
    assert len(got.attentions) == 3
    for a, b in zip(got.attentions, expected.attentions):
        assert a.shape == (2, 4, 17, 17)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_fused_path_equals_own_attention(hf_model) -> None:
    ours = ViT.from_hf(hf_model).eval()
    x = images(3, 3, 16, 16)
    fast = ours(x)
    assert fast.attentions is None
    torch.testing.assert_close(fast.last_hidden_state,
                               ours(x, output_attentions=True).last_hidden_state,
                               rtol=0, atol=1e-5)


def test_interpolated_positions_equal_hf(hf_model) -> None:
    ours = ViT.from_hf(hf_model).eval()
    for height, width in ((24, 32), (8, 8), (16, 16)):
        x = images(2, 3, height, width)
        expected = hf_model(x, interpolate_pos_encoding=True).last_hidden_state
        got = ours(x, interpolate_pos_encoding=True).last_hidden_state
        assert got.shape == (2, 1 + height * width // 16, 32)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_classification_logits_equal_hf_and_round_trip() -> None:
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(hf_config()).eval()
    randomise(hf)
    ours = ViT.from_hf(hf).eval()
    x = images(2, 3, 16, 16)
    torch.testing.assert_close(ours(x).logits, hf(x).logits, rtol=0, atol=1e-5)
    fresh = transformers.ViTForImageClassification(hf_config()).eval()
    fresh.load_state_dict(ours.hf_state_dict(), strict=True)
    torch.testing.assert_close(fresh(x).logits, hf(x).logits, rtol=0, atol=0)


def test_hf_model_without_pooler() -> None:
    hf = transformers.ViTModel(hf_config(), add_pooling_layer=False).eval()
    ours = ViT.from_hf(hf)
    assert ours.pooler is None and ours(images(1, 3, 16, 16)).pooler_output is None


@pytest.mark.parametrize("name, hidden, layers, heads, mlp, patch", [
    ("B/16", 768, 12, 12, 3072, 16), ("L/16", 1024, 24, 16, 4096, 16),
    ("H/14", 1280, 32, 16, 5120, 14)])
def test_meta_parameter_counts_equal_hf(name, hidden, layers, heads, mlp, patch) -> None:
    config = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers,
                                    num_attention_heads=heads, intermediate_size=mlp,
                                    patch_size=patch, num_labels=1000)
    ours = ViT.from_config(config, device="meta", num_labels=1000)
    with torch.device("meta"):
        hf = transformers.ViTForImageClassification(config)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in hf.parameters())
    backbone = ViT.from_config(config, device="meta", pooler=True)
    with torch.device("meta"):
        hf_backbone = transformers.ViTModel(config)
    assert sum(p.numel() for p in backbone.parameters()) == \
        sum(p.numel() for p in hf_backbone.parameters())


def test_position_options_and_their_interpolation() -> None:
    base = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2,
                intermediate_size=32, num_labels=3)
    torch.manual_seed(0)
    two_d = ViT(ViTConfig(positions="2d", **base)).eval()
    table = two_d.position_table(4, 4)
    assert table.shape == (1, 17, 16)
    # patch (row 1, col 2): row half from row_position[1], column half from col_position[2]
    torch.testing.assert_close(table[0, 1 + 4 + 2], torch.cat([two_d.row_position[1],
                                                                two_d.col_position[2]]))
    assert two_d(images(2, 3, 8, 12), interpolate_pos_encoding=True).logits.shape == (2, 3)
    none = ViT(ViTConfig(positions="none", **base)).eval()
    assert not any("position" in n for n, _ in none.named_parameters())
    # without positions the patch tokens are permutation-equivariant: permuting the patches
    # permutes their outputs and leaves [CLS] unchanged
    x = images(1, 3, 16, 16)
    swapped = x.clone()
    swapped[..., 0:4, 0:4], swapped[..., 12:16, 12:16] = x[..., 12:16, 12:16], x[..., 0:4, 0:4]
    a, b = none(x).last_hidden_state, none(swapped).last_hidden_state
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(a[:, 1], b[:, 16], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="only 1-D positions"):
        two_d.hf_state_dict()


def test_training_step_reduces_loss() -> None:
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=2, hidden_size=16, num_layers=2, num_heads=2,
                          intermediate_size=32, num_channels=1, num_labels=4))
    x, y = images(16, 1, 8, 8), torch.arange(16) % 4
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = F.cross_entropy(model(x).logits, y).item()
    for _ in range(80):
        loss = F.cross_entropy(model(x).logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5 * first


def test_errors() -> None:
    with pytest.raises(ValueError, match="image_size 30 must be divisible by patch_size 4"):
        ViTConfig(image_size=30, patch_size=4)
    model = ViT(ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=1,
                          num_heads=2, intermediate_size=32))
    with pytest.raises(ValueError, match="pixel_values has 1 channels but the model expects "
                                         "num_channels=3"):
        model(images(1, 1, 16, 16))
    with pytest.raises(ValueError, match="not divisible by patch_size 4"):
        model(images(1, 3, 18, 16), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
        model(images(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"shape \(batch, channels, height, width\)"):
        model(images(3, 16, 16))
    with pytest.raises(TypeError, match="float tensor"):
        model(torch.zeros(1, 3, 16, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="hf_model must be a transformers ViTModel or ViTForImageClassification"):
        ViT.from_hf(transformers.SwinModel(transformers.SwinConfig(
            image_size=16, embed_dim=8, depths=[1], num_heads=[1], window_size=4)))
    with pytest.raises(TypeError, match="config must be a ViTConfig"):
        ViT(hf_config())
    with pytest.raises(ValueError, match="hidden_act must be 'gelu'"):
        ViT.from_config(hf_config(hidden_act="relu"))
