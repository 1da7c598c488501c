"""lecture_pkg.models.mae against transformers' ViTMAEForPreTraining (random-initialised small
configuration, the same noise), the masking's invariants, the fixed positions against HF's
initialisation, and clear errors."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.models.mae import MAE, MAEConfig, random_masking, sincos_2d
from lecture_pkg.models.vit import ViTConfig

transformers = pytest.importorskip("transformers")


def hf_config(**overrides: object) -> transformers.ViTMAEConfig:
    sizes = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 64, "decoder_hidden_size": 16,
             "decoder_num_hidden_layers": 2, "decoder_num_attention_heads": 2,
             "decoder_intermediate_size": 32, "attn_implementation": "eager"}
    return transformers.ViTMAEConfig(**{**sizes, **overrides})


def images(*size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("norm_pix_loss", [False, True])
def test_loss_logits_and_mask_equal_hf(norm_pix_loss: bool) -> None:
    torch.manual_seed(0)
    hf = transformers.ViTMAEForPreTraining(hf_config(norm_pix_loss=norm_pix_loss)).eval()
    with torch.no_grad():  # every trainable weight off its initial value
        for param in hf.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
    ours = MAE.from_hf(hf).eval()
    x, noise = images(3, 3, 16, 16), torch.rand(3, 16, generator=torch.Generator().manual_seed(2))
    expected, got = hf(x, noise=noise), ours(x, noise=noise)
    torch.testing.assert_close(got.mask, expected.mask, rtol=0, atol=0)
    assert got.mask.sum().item() == 3 * 12  # 75 % of 16 patches masked in every image
    torch.testing.assert_close(got.ids_restore, expected.ids_restore, rtol=0, atol=0)
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
    fresh = transformers.ViTMAEForPreTraining(hf_config(norm_pix_loss=norm_pix_loss)).eval()
    fresh.load_state_dict(ours.hf_state_dict(), strict=True)
    torch.testing.assert_close(fresh(x, noise=noise).loss, expected.loss, rtol=0, atol=0)


def test_fixed_positions_equal_hf_construction() -> None:
    # HF's table, with the two halves swapped as HF's initialize_weights does (the MAE code
    # puts the column half first)
    from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding as hf_table

    for grid, dim in ((4, 32), (3, 16), (7, 8)):
        table = hf_table(grid, grid, dim, cls_token=True)
        table = torch.cat([table[:, dim // 2:], table[:, :dim // 2]], dim=1)
        torch.testing.assert_close(sincos_2d(grid, dim), table, rtol=0, atol=1e-6)
    ours = MAE(MAEConfig.from_hf(hf_config()))
    assert not ours.encoder.position.requires_grad
    torch.testing.assert_close(ours.encoder.position[0], sincos_2d(4, 32))


def test_random_masking_keeps_the_lowest_noise_and_restores_order() -> None:
    x = images(2, 8, 5)
    noise = torch.rand(2, 8, generator=torch.Generator().manual_seed(3))
    kept, mask, ids_restore = random_masking(x, 0.75, noise)
    assert kept.shape == (2, 2, 5) and mask.sum(1).tolist() == [6.0, 6.0]
    for b in range(2):
        lowest = noise[b].argsort()[:2]
        torch.testing.assert_close(kept[b], x[b, lowest])
        assert mask[b, lowest].sum() == 0
        order = noise[b].argsort()
        assert torch.equal(order[ids_restore[b]], torch.arange(8))


def test_errors() -> None:
    encoder = ViTConfig(image_size=8, patch_size=2, hidden_size=16, num_layers=1,
                        num_heads=2, intermediate_size=16)
    with pytest.raises(ValueError, match="mask_ratio must be in"):
        MAEConfig(encoder=encoder, mask_ratio=1.0)
    with pytest.raises(ValueError, match="no head"):
        MAEConfig(encoder=ViTConfig(image_size=8, patch_size=2, num_labels=3))
    with pytest.raises(ValueError, match="noise must have shape"):
        random_masking(images(2, 8, 5), 0.5, torch.rand(2, 7))
