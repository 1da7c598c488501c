"""lecture_pkg.models.swin against transformers' SwinModel / SwinForImageClassification
(random-initialised small configurations with shifted blocks and padding), the window helpers
against loops, and clear errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from lecture_pkg.models.swin import (
    PatchMerging,
    Swin,
    SwinConfig,
    cyclic_shift,
    region_labels,
    relative_position_index,
    shifted_window_mask,
    window_and_shift,
    window_partition,
    window_reverse,
)

transformers = pytest.importorskip("transformers")


def hf_config(**overrides: object) -> transformers.SwinConfig:
    sizes = {"image_size": 40, "patch_size": 2, "embed_dim": 16, "depths": [2, 3, 1],
             "num_heads": [2, 2, 4], "window_size": 3, "attn_implementation": "eager"}
    return transformers.SwinConfig(**{**sizes, **overrides})


def randomise(model: torch.nn.Module) -> None:
    """Move every parameter (the zero-initialised bias tables included) off its init."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))


def images(*size: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*size, generator=torch.Generator().manual_seed(seed))


def last_block_per_stage(depths: list[int]) -> list[int]:
    return [sum(depths[:s + 1]) - 1 for s in range(len(depths))]


# Feature maps per stage: 40 px / 2 = 20 -> 10 -> 5 with window 3 (padded to 21, 12, 6, shifted
# blocks in every stage); 37 px pads the image to 38 first (19 -> 10 -> 5); the 16-px case ends
# on a 4x4 map with window 4 (one window, shift switched off); the 3-channel default otherwise.
CASES = {
    "padded windows": (dict(), 40),
    "padded image": (dict(image_size=37), 37),
    "map equals window": (dict(image_size=32, window_size=4, depths=[2, 2], num_heads=[2, 4]),
                          32),
    "absolute positions": (dict(use_absolute_embeddings=True, depths=[2, 2],
                                num_heads=[2, 2]), 40),
}


@pytest.mark.parametrize("case", CASES)
def test_outputs_and_attentions_equal_hf(case: str) -> None:
    overrides, size = CASES[case]
    torch.manual_seed(0)
    hf = transformers.SwinModel(hf_config(**overrides)).eval()
    randomise(hf)
    ours = Swin.from_hf(hf).eval()
    x = images(2, 3, size, size)
    expected = hf(x, output_attentions=True)
    got = ours(x, output_attentions=True)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state,
                               rtol=0, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=0, atol=1e-5)
    # HF returns the last block's weights of each stage; we return every block's
    for block, theirs in zip(last_block_per_stage(ours.config.depths), expected.attentions):
        torch.testing.assert_close(got.attentions[block], theirs, rtol=0, atol=1e-5)
    # the fused path gives the same output as the package's own attention
    torch.testing.assert_close(ours(x).last_hidden_state, got.last_hidden_state,
                               rtol=0, atol=1e-5)


def test_classification_logits_equal_hf_and_round_trip() -> None:
    torch.manual_seed(0)
    config = hf_config(num_labels=7)
    hf = transformers.SwinForImageClassification(config).eval()
    randomise(hf)
    ours = Swin.from_hf(hf).eval()
    x = images(2, 3, 40, 40)
    torch.testing.assert_close(ours(x).logits, hf(x).logits, rtol=0, atol=1e-5)
    fresh = transformers.SwinForImageClassification(config).eval()
    fresh.load_state_dict(ours.hf_state_dict(), strict=False)  # the index buffer is HF's own
    torch.testing.assert_close(fresh(x).logits, hf(x).logits, rtol=0, atol=0)


def test_relative_position_index_equals_hf_and_the_formula() -> None:
    for window in (2, 3, 7):
        hf = transformers.models.swin.modeling_swin.SwinRelativePositionBias(2, (window, window))
        index = relative_position_index(window)
        assert torch.equal(index.flatten(), hf.relative_position_index)
        for (i, (yi, xi)), (j, (yj, xj)) in itertools.product(
                enumerate(itertools.product(range(window), repeat=2)), repeat=2):
            assert index[i, j] == (yi - yj + window - 1) * (2 * window - 1) + (xi - xj + window - 1)
        assert int(index.max()) == (2 * window - 1) ** 2 - 1


def test_window_partition_reverse_and_shift_round_trip() -> None:
    x = images(2, 6, 9, 5)
    windows = window_partition(x, 3)
    assert windows.shape == (2 * 2 * 3, 3, 3, 5)
    torch.testing.assert_close(windows[4], x[0, 3:6, 3:6])  # image 0, window row 1, col 1
    torch.testing.assert_close(window_reverse(windows, 3, 6, 9), x)
    shifted = cyclic_shift(x, -1)
    torch.testing.assert_close(shifted[:, 0, 0], x[:, 1, 1])
    torch.testing.assert_close(cyclic_shift(shifted, 1), x)


def test_region_labels_and_mask_against_a_loop() -> None:
    height, width, window, shift = 8, 12, 4, 2
    labels = region_labels(height, width, window, shift)
    band = lambda i, n: 0 if i < n - window else 1 if i < n - shift else 2  # noqa: E731
    for y, x in itertools.product(range(height), range(width)):
        assert labels[y, x] == 3 * band(y, height) + band(x, width)
    assert labels.unique().tolist() == list(range(9))
    mask = shifted_window_mask(height, width, window, shift)
    assert mask.shape == (6, 16, 16)
    assert mask[0].all()  # the top-left window lies inside region 0 only
    # the bottom-right window holds 4 regions of 2x2 tokens: each token sees 4 of 16
    assert mask[-1].sum(-1).tolist() == [4] * 16
    # a token in the bottom-right window attends to another iff they were neighbours before
    # the roll, i.e. their original positions lie in the same window of the unrolled map...
    # ...which for a window on the last row/column means the same region label
    rolled = torch.arange(height * width).view(1, height, width, 1)
    original = window_partition(cyclic_shift(rolled, -shift), window).flatten(1)[-1]
    y, x = original // width, original % width
    same = (band_y := torch.tensor([band(int(v), height) for v in y]))[:, None] == band_y[None]
    same &= (band_x := torch.tensor([band(int(v), width) for v in x]))[:, None] == band_x[None]
    assert torch.equal(mask[-1], same)


def test_window_and_shift_rule() -> None:
    assert window_and_shift(56, 56, 7) == (7, 3)
    assert window_and_shift(7, 7, 7) == (7, 0)  # Swin-T's last stage: one window, no shift
    assert window_and_shift(4, 9, 7) == (4, 0)
    assert window_and_shift(10, 10, 7) == (7, 3)  # padded to 14 x 14


def test_patch_merging_halves_resolution_doubles_channels() -> None:
    torch.manual_seed(0)
    merge = PatchMerging(4)
    x = images(2, 6 * 5, 4)
    out = merge(x, (6, 5))  # odd width: padded to 6
    assert out.shape == (2, 3 * 3, 8)
    grid = torch.nn.functional.pad(x.view(2, 6, 5, 4), (0, 0, 0, 1))
    # token (1, 2) of the merged map: rows 2-3, columns 4-5; order TL, BL, TR, BR
    block = torch.cat([grid[:, 2, 4], grid[:, 3, 4], grid[:, 2, 5], grid[:, 3, 5]], dim=-1)
    torch.testing.assert_close(out[:, 1 * 3 + 2], merge.reduction(merge.norm(block)))
    assert merge.reduction.bias is None


def test_meta_parameter_count_swin_t_equals_hf() -> None:
    config = transformers.SwinConfig(num_labels=1000)
    ours = Swin.from_config(config, device="meta", num_labels=1000)
    with torch.device("meta"):
        hf = transformers.SwinForImageClassification(config)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


def test_drop_path_only_in_training() -> None:
    torch.manual_seed(0)
    model = Swin(SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=(2,),
                            num_heads=(2,), window_size=4, drop_path_rate=0.5))
    x = images(4, 3, 16, 16)
    model.eval()
    torch.testing.assert_close(model(x).pooler_output, model(x).pooler_output)
    model.train()
    assert not torch.allclose(model(x).pooler_output, model(x).pooler_output)


def test_errors() -> None:
    torch.manual_seed(0)
    hf = transformers.SwinModel(hf_config(image_size=28, patch_size=4, window_size=7,
                                          depths=[2, 2], num_heads=[2, 2])).eval()
    ours = Swin.from_hf(hf)
    # stage 1 is 7 x 7 (= the window: fine); stage 2 is 4 x 4, smaller than the window, and
    # the 13 x 13 bias table cannot serve 4 x 4 windows. HF fails with a shape error there.
    with pytest.raises(RuntimeError, match="must match"):
        hf(images(1, 3, 28, 28))
    with pytest.raises(ValueError, match="4x4 feature map is smaller than window_size 7"):
        ours(images(1, 3, 28, 28))
    with pytest.raises(ValueError, match="pixel_values has 1 channels but the model expects "
                                         "num_channels=3"):
        ours(images(1, 1, 28, 28))
    with pytest.raises(TypeError, match="hf_model must be a transformers SwinModel"):
        Swin.from_hf(transformers.ViTModel(transformers.ViTConfig(
            image_size=8, patch_size=4, hidden_size=8, num_hidden_layers=1,
            num_attention_heads=1, intermediate_size=8)))
    with pytest.raises(ValueError, match="does not split into 3x3 windows"):
        window_partition(images(1, 4, 6, 2), 3)
    with pytest.raises(ValueError, match="depths .* and num_heads .* must be"):
        SwinConfig(depths=(2, 2), num_heads=(3,))
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        SwinConfig(embed_dim=10, num_heads=(3, 6, 12, 24))
    with pytest.raises(ValueError, match="need 0 < shift < window"):
        region_labels(4, 4, 5, 2)


def test_shift_windows_off_keeps_windows_isolated() -> None:
    # one stage of two blocks on a 4 x 4 map with 2 x 2 windows: without the shift no token
    # ever attends outside its window, so a change in the top-left window leaves the other
    # three windows' outputs untouched; with the shift (same weights) it reaches them
    torch.manual_seed(0)
    sizes = {"image_size": 8, "patch_size": 2, "num_channels": 1, "embed_dim": 8,
             "depths": (2,), "num_heads": (2,), "window_size": 2, "drop_path_rate": 0.0}
    shifted = Swin(SwinConfig(**sizes)).eval()
    plain = Swin(SwinConfig(**sizes, shift_windows=False)).eval()
    plain.load_state_dict(shifted.state_dict())
    x = images(1, 1, 8, 8)
    changed = x.clone()
    changed[..., :4, :4] += 1.0  # the pixels of the top-left 2 x 2 window of patches
    top_left = torch.tensor([0, 1, 4, 5])  # its tokens, row by row on the 4 x 4 map
    others = torch.tensor([i for i in range(16) if i not in top_left.tolist()])
    with torch.no_grad():
        a, b = plain(x).last_hidden_state, plain(changed).last_hidden_state
        torch.testing.assert_close(a[:, others], b[:, others], rtol=0, atol=0)
        assert not torch.allclose(a[:, top_left], b[:, top_left])
        a, b = shifted(x).last_hidden_state, shifted(changed).last_hidden_state
        assert not torch.allclose(a[:, others], b[:, others])
        # the flag only drops the shift: a model calling every block unshifted agrees
        h, size = plain.embed(x)
        for block in plain.stages[0].blocks:
            h, _ = block(h, size, shifted=False)
        torch.testing.assert_close(plain.norm(h), plain(x).last_hidden_state)
    with pytest.raises(ValueError, match="shift_windows must be True or False"):
        SwinConfig(shift_windows=1)
