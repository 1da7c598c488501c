"""lecture_pkg.models.deit against transformers' DeiTForImageClassificationWithTeacher
(random-initialised small configuration), its hard-distillation loss against a plain
log-softmax computation, and clear errors."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.models.deit import DeiT, hard_distillation_loss
from lecture_pkg.models.vit import ViTConfig

transformers = pytest.importorskip("transformers")


def hf_config(**overrides: object) -> transformers.DeiTConfig:
    sizes = {"image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 64, "num_labels": 5,
             "attn_implementation": "eager"}
    return transformers.DeiTConfig(**{**sizes, **overrides})


@pytest.fixture(scope="module")
def hf_model() -> transformers.DeiTForImageClassificationWithTeacher:
    torch.manual_seed(0)
    model = transformers.DeiTForImageClassificationWithTeacher(hf_config()).eval()
    with torch.no_grad():  # move every weight off its initial value (zeros, ones, symmetry)
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


def images(*size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*size, generator=torch.Generator().manual_seed(seed))


def test_logits_of_both_heads_and_attentions_equal_hf(hf_model) -> None:
    ours = DeiT.from_hf(hf_model).eval()
    x = images(2, 3, 16, 16)
    expected = hf_model(x, output_attentions=True)
    got = ours(x, output_attentions=True)
    for name in ("logits", "cls_logits", "distillation_logits"):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=0,
                                   atol=1e-5)
    for a, b in zip(got.attentions, expected.attentions):
        assert a.shape == (2, 4, 18, 18)  # [CLS], distillation token, 16 patches
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours(x).logits, got.logits, rtol=0, atol=1e-5)  # fused path
    bigger = images(2, 3, 24, 20)
    torch.testing.assert_close(ours(bigger, interpolate_pos_encoding=True).logits,
                               hf_model(bigger, interpolate_pos_encoding=True).logits,
                               rtol=0, atol=1e-5)


def test_round_trip_into_hf(hf_model) -> None:
    ours = DeiT.from_hf(hf_model)
    fresh = transformers.DeiTForImageClassificationWithTeacher(hf_config()).eval()
    fresh.load_state_dict(ours.hf_state_dict(), strict=True)
    x = images(2, 3, 16, 16)
    torch.testing.assert_close(fresh(x).logits, hf_model(x).logits, rtol=0, atol=0)
    assert ours.no_weight_decay() == {"cls_token", "distillation_token", "position"}


def test_hard_distillation_loss() -> None:
    torch.manual_seed(0)
    model = DeiT(ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16,
                           num_layers=1, num_heads=2, intermediate_size=16, num_labels=3))
    out = model(images(4, 1, 8, 8))
    labels, teacher = torch.tensor([0, 1, 2, 0]), images(4, 3, seed=2)
    log_p_cls = out.cls_logits.double().log_softmax(-1)
    log_p_dist = out.distillation_logits.double().log_softmax(-1)
    targets = teacher.argmax(-1)
    by_hand = -0.5 * sum(log_p_cls[i, labels[i]] + log_p_dist[i, targets[i]]
                         for i in range(4)) / 4
    torch.testing.assert_close(hard_distillation_loss(out, labels, teacher).double(), by_hand,
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"teacher_logits must have shape \(4, 3\)"):
        hard_distillation_loss(out, labels, teacher[:, :2])


def test_errors() -> None:
    with pytest.raises(ValueError, match="DeiT needs num_labels > 0"):
        DeiT(ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_layers=1, num_heads=2,
                       intermediate_size=16))
    with pytest.raises(TypeError, match="DeiTForImageClassificationWithTeacher"):
        DeiT.from_hf(transformers.ViTModel(transformers.ViTConfig(
            image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=16)))
