"""lecture_pkg.models.detr: shapes, the 2-D sine positions against Hugging Face's
DetrSinePositionEmbedding, what the queries see, the auxiliary losses, a short training run
that must beat its start, clear errors, and the shipped checkpoint's recorded held-out AP."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.detection import (
    SCENES,
    detection_ap,
    detr_loss,
    load_shapes_detr,
    set_loss,
    shapes_detr_info,
    synthetic_shapes,
)
from lecture_pkg.models.detr import DETR, DETRConfig, sine_positions_2d

SMALL = DETRConfig(image_size=16, d_model=32, num_heads=2, d_ff=64, num_queries=5,
                   encoder_layers=1, decoder_layers=2)


def model(config: DETRConfig = SMALL, seed: int = 0) -> DETR:
    torch.manual_seed(seed)
    return DETR(config).eval()


def images(n: int, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_output_shapes_and_ranges() -> None:
    out = model()(images(3))
    assert out.logits.shape == (3, 5, 4)  # 3 classes + "no object"
    assert out.boxes.shape == (3, 5, 4)
    assert ((out.boxes > 0) & (out.boxes < 1)).all()
    assert len(out.aux) == 1 and out.aux[0][0].shape == (3, 5, 4)
    boxes, scores, classes = model().predict(images(3))
    assert boxes.shape == (3, 5, 4) and scores.shape == classes.shape == (3, 5)
    assert (classes < 3).all() and (scores <= 1).all()


def test_images_are_independent_in_a_batch() -> None:
    net, x = model(), images(4)
    torch.testing.assert_close(net(x[1:2]).logits, net(x).logits[1:2], rtol=1e-5, atol=1e-5)


def test_queries_are_a_set_permuting_them_permutes_the_outputs() -> None:
    # decoder self-attention is not causal and carries no query order, so permuting the
    # learned queries permutes the predictions and nothing else
    net, x = model(), images(2)
    before = net(x)
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        net.queries.copy_(net.queries[perm])
    after = net(x)
    torch.testing.assert_close(after.logits, before.logits[:, perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after.boxes, before.boxes[:, perm], rtol=1e-5, atol=1e-5)


def test_sine_positions_equal_hf() -> None:
    modeling = pytest.importorskip("transformers.models.detr.modeling_detr")
    hf = modeling.DetrSinePositionEmbedding(num_position_features=16, normalize=True)
    expected = hf(torch.Size([1, 3, 4, 6]), "cpu", torch.float32)  # (1, 32, 4, 6)
    got = sine_positions_2d(4, 6, 32)
    torch.testing.assert_close(got, expected[0].flatten(1).T, rtol=0, atol=1e-5)


def test_sine_positions_encode_rows_and_columns_independently() -> None:
    pos = sine_positions_2d(3, 5, 16).reshape(3, 5, 16)
    assert torch.equal(pos[:, 0, :8], pos[:, 4, :8])  # y half: the same along a row
    assert torch.equal(pos[0, :, 8:], pos[2, :, 8:])  # x half: the same down a column
    assert torch.unique(pos.reshape(15, 16), dim=0).shape[0] == 15


@pytest.mark.parametrize("positions", ["sine", "learned", "none"])
def test_position_choices(positions: str) -> None:
    config = DETRConfig(**{**SMALL.__dict__, "positions": positions})
    net = model(config)
    assert (net.position is None) == (positions == "none")
    assert ("position" in dict(net.named_parameters())) == (positions == "learned")
    assert net(images(1)).logits.shape == (1, 5, 4)


def test_set_loss_adds_the_auxiliary_losses() -> None:
    data = synthetic_shapes(3, image_size=16, max_size=8,
                            generator=torch.Generator().manual_seed(2))
    out = model()(data.images)
    expected = sum(detr_loss(lg, bx, data.classes, data.boxes)["loss"]
                   for lg, bx in [*out.aux, (out.logits, out.boxes)])
    torch.testing.assert_close(set_loss(out, data.classes, data.boxes), expected)


def test_a_short_training_run_lowers_the_loss() -> None:
    torch.manual_seed(0)
    data = synthetic_shapes(32, image_size=16, max_size=8, max_objects=2,
                            generator=torch.Generator().manual_seed(3))
    net = DETR(SMALL)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(40):
        loss = set_loss(net(data.images), data.classes, data.boxes)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


def test_backbone_widths_double_from_backbone_width() -> None:
    net = DETR(DETRConfig(image_size=16, d_model=32, num_heads=2, backbone_stages=2,
                          backbone_width=24))
    convs = [m for m in net.backbone.body if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [24, 24, 48, 48]
    assert net.backbone.proj.in_channels == 48 and net.backbone.proj.out_channels == 32
    assert net.encode(images(2)).shape == (2, 16, 32)  # a 4 x 4 map of 32 channels


def test_config_and_input_errors() -> None:
    with pytest.raises(ValueError, match="backbone_width"):
        DETRConfig(backbone_width=0)
    with pytest.raises(ValueError, match="d_model must be divisible by 4"):
        DETRConfig(d_model=30, num_heads=2)
    with pytest.raises(ValueError, match="image_size"):
        DETRConfig(image_size=30)
    with pytest.raises(ValueError, match="positions"):
        DETRConfig(positions="rope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channels"):
        model()(torch.rand(1, 1, 16, 16))
    with pytest.raises(ValueError, match="16x16"):
        model()(torch.rand(1, 3, 32, 32))


def test_checkpoint_reproduces_its_recorded_heldout_ap() -> None:
    net, _ = load_shapes_detr()
    meta = shapes_detr_info()
    assert meta["scenes"] == "cluttered"  # the page's task
    test = SCENES[meta["scenes"]](meta["test_n"],
                                  generator=torch.Generator().manual_seed(meta["test_seed"]))
    ap = detection_ap(net, test.images, test.boxes, test.classes)
    assert ap["ap"] == pytest.approx(meta["heldout_ap50"], abs=2e-3)
    # the validation curve printed during training came from other scenes, and it rose
    steps, _, val_ap, *_ = zip(*meta["curve"])
    assert meta["val_seed"] not in (meta["test_seed"], meta["train_seed"])
    assert steps[-1] == meta["steps"] and val_ap[-1] > val_ap[0]
