"""lecture_pkg.classical_detection and the cluttered scenes of lecture_pkg.detection: the scenes'
boxes against the pixels drawn, determinism by seed and clear errors; connected components
against scipy.ndimage.label; both classical detectors on cases whose answer is known (a lone
shape, the uncluttered scenes, which a threshold solves exactly), their tuning, and errors."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.classical_detection import (
    connected_components,
    foreground,
    template_detector,
    template_scores,
    threshold_detector,
    tune_template_detector,
    tune_threshold_detector,
)
from lecture_pkg.detection import (
    SCENES,
    _shape_mask,
    average_precision,
    box_cxcywh_to_xyxy,
    box_iou,
    cluttered_shapes,
    synthetic_shapes,
)


def scenes(n: int = 40, seed: int = 0, **kwargs):
    return cluttered_shapes(n, generator=torch.Generator().manual_seed(seed), **kwargs)


def full_mask(box: torch.Tensor, kind: int, size: int = 32) -> torch.Tensor:
    x0, y0, x1, _ = (box_cxcywh_to_xyxy(box) * size).round().long().tolist()
    return _shape_mask(kind, x0, y0, x1 - x0, size)


# ---------------------------------------------------------------------------------------------
# cluttered scenes
# ---------------------------------------------------------------------------------------------

def test_scenes_are_deterministic_and_well_formed() -> None:
    a, b, c = scenes(seed=4), scenes(seed=4), scenes(seed=5)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert all(torch.equal(x, y) for x, y in zip(a.boxes, b.boxes))
    assert a.images.shape == (40, 3, 32, 32)
    assert float(a.images.min()) >= 0 and float(a.images.max()) <= 1
    for boxes, classes, visible in zip(a.boxes, a.classes, a.visible):
        assert 1 <= len(boxes) <= 5
        assert boxes.shape == (len(classes), 4) and visible.shape == (len(classes), 32, 32)
        assert classes.dtype == torch.long and set(classes.tolist()) <= {0, 1, 2}
        side = boxes[:, 2] * 32
        assert torch.equal(boxes[:, 2], boxes[:, 3])  # bounding squares
        assert ((side >= 5 - 1e-4) & (side <= 14 + 1e-4)).all()
    assert SCENES["cluttered"] is cluttered_shapes and SCENES["shapes"] is synthetic_shapes


def test_boxes_agree_with_the_pixels_drawn() -> None:
    data = scenes(60, seed=1, noise=0.0)
    overlapping = 0
    for image, boxes, classes, visible in zip(data.images, data.boxes, data.classes,
                                              data.visible):
        xyxy = box_cxcywh_to_xyxy(boxes)
        iou, _ = box_iou(xyxy, xyxy)
        off_diagonal = iou[~torch.eye(len(boxes), dtype=torch.bool)]
        assert (off_diagonal <= 0.4 + 1e-6).all()
        overlapping += int((off_diagonal > 0).sum())
        for box, kind, seen in zip(boxes, classes.tolist(), visible):
            full = full_mask(box, kind)
            assert not (seen & ~full).any()  # what is seen lies inside the shape
            assert int(seen.sum()) >= 0.6 * int(full.sum())  # at least 60 % is seen
            colours = image[:, seen]  # a shape is one flat colour where it is seen
            assert torch.allclose(colours, colours[:, :1].expand_as(colours), atol=1e-6)
    assert overlapping > 0  # shapes do overlap or touch in some scenes


def test_scene_options() -> None:
    plain = scenes(10, seed=2, strokes=0, texture=0.0, noise=0.0, max_objects=1)
    assert all(len(b) == 1 for b in plain.boxes)
    # no texture, no strokes, no noise: the background is one grey level per image
    for image, seen in zip(plain.images, plain.visible):
        background = image[:, ~seen[0]]
        assert torch.allclose(background, background[:, :1].expand_as(background))


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, "n"), ({"max_size": 20}, "max_size"), ({"min_size": 2}, "min_size"),
    ({"max_overlap": 1.5}, "max_overlap"), ({"min_visible": -0.1}, "min_visible"),
    ({"texture": "a"}, "texture"), ({"strokes": -1}, "strokes"),
    ({"min_brightness": 0.0}, "min_brightness"),
])
def test_scenes_reject_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cluttered_shapes(**{"n": 2, **kwargs})


# ---------------------------------------------------------------------------------------------
# threshold and components
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_components_equal_scipy(seed: int) -> None:
    ndimage = pytest.importorskip("scipy.ndimage")
    mask = torch.rand(4, 20, 17, generator=torch.Generator().manual_seed(seed)) > 0.55
    labels = connected_components(mask)
    for m, lab in zip(mask, labels):
        ref, count = ndimage.label(m.numpy(), structure=[[1, 1, 1]] * 3)
        ref = torch.from_numpy(ref)
        assert torch.equal(lab > 0, m) and len(torch.unique(lab[m])) == count
        pairs = torch.unique(torch.stack([lab[m], ref[m]], 1), dim=0)
        assert len(pairs) == count  # the same partition: one ref label per label


def one_shape(kind: int, x0: int, y0: int, s: int) -> torch.Tensor:
    image = torch.full((1, 3, 32, 32), 0.1)
    image[0][:, _shape_mask(kind, x0, y0, s, 32)] = torch.tensor([0.2, 0.9, 0.4])[:, None]
    return image


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_threshold_detector_finds_a_lone_shape(kind: int) -> None:
    found = threshold_detector(one_shape(kind, 9, 5, 11))
    assert found.classes[0].tolist() == [kind]
    torch.testing.assert_close(found.boxes[0], torch.tensor([[14.5, 10.5, 11, 11]]) / 32)


def test_threshold_detector_solves_the_uncluttered_scenes() -> None:
    data = synthetic_shapes(200, generator=torch.Generator().manual_seed(1))
    found = threshold_detector(data.images, 0.4)
    for iou in (0.5, 0.75, 0.95):
        assert average_precision(*found, data.boxes, data.classes, 3, iou)["ap"] == 1.0


def test_threshold_detector_fails_on_cluttered_scenes() -> None:
    data = scenes(100, seed=3)
    found = threshold_detector(data.images, 0.6)
    assert average_precision(*found, data.boxes, data.classes, 3)["ap"] < 0.5


def test_contrast_feature_follows_the_background() -> None:
    ramp = torch.linspace(0, 1, 32).expand(1, 3, 32, 32).contiguous()
    assert float(foreground(ramp, "contrast", 5)[0, :, 3:-3].max()) < 1e-5
    image = ramp.clone()
    image[0, :, 10, 10] += 0.3
    assert float(foreground(image, "contrast", 5)[0, 10, 10]) > 0.3


def test_threshold_tuning_returns_its_best_setting() -> None:
    data = scenes(30, seed=6)
    best = tune_threshold_detector(data.images, data.boxes, data.classes,
                                   thresholds={"brightness": (0.6, 0.7)}, min_areas=(9,),
                                   fills=((0.9, 0.64),), iou_thresholds=(0.5,))
    ap = best.pop("val_ap")
    found = threshold_detector(data.images, **best)
    assert average_precision(*found, data.boxes, data.classes, 3)["ap"] == pytest.approx(ap)
    for t in (0.6, 0.7):
        other = threshold_detector(data.images, t, min_area=9)
        assert average_precision(*other, data.boxes, data.classes, 3)["ap"] <= ap + 1e-12


# ---------------------------------------------------------------------------------------------
# templates
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [0, 1, 2])
def test_template_scores_peak_at_the_shape(kind: int) -> None:
    scores = template_scores(one_shape(kind, 7, 12, 9), 9)  # (1, 3, 24, 24)
    assert scores.shape == (1, 3, 24, 24)
    assert float(scores[0, kind, 12, 7]) == pytest.approx(1.0, abs=1e-4)
    assert float(scores.max()) <= 1.0 + 1e-6
    # the best window is this one, with this shape
    assert divmod(int(scores[0].argmax()), 24 * 24)[0] == kind


def test_template_scores_ignore_colour_and_brightness() -> None:
    a = one_shape(1, 4, 4, 10)
    b = 0.3 + 0.5 * a.flip(1)  # other colours, other brightness, same shape
    torch.testing.assert_close(template_scores(a, 10), template_scores(b, 10),
                               rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_template_detector_finds_a_lone_shape(kind: int) -> None:
    found = template_detector(one_shape(kind, 3, 15, 12))
    assert found.classes[0][0] == kind
    torch.testing.assert_close(found.boxes[0][0], torch.tensor([9.0, 21, 12, 12]) / 32)
    assert found.scores[0][0] == pytest.approx(1.0, abs=1e-4)
    assert len(found.boxes[0]) <= 10 and (found.scores[0].diff() <= 0).all()


def test_template_detector_on_the_uncluttered_scenes() -> None:
    data = synthetic_shapes(100, generator=torch.Generator().manual_seed(2))
    found = template_detector(data.images, range(6, 13))
    assert average_precision(*found, data.boxes, data.classes, 3, 0.9)["ap"] > 0.95


def test_template_tuning_returns_its_best_setting() -> None:
    data = scenes(30, seed=7)
    best = tune_template_detector(data.images, data.boxes, data.classes, min_scores=(0.5,),
                                  nms_ious=(0.2, 0.4), iou_thresholds=(0.5,))
    ap = best.pop("val_ap")
    found = template_detector(data.images, **best)
    assert average_precision(*found, data.boxes, data.classes, 3)["ap"] == pytest.approx(ap)


def test_classical_detectors_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="images"):
        threshold_detector(torch.rand(3, 32, 32))
    with pytest.raises(ValueError, match="square"):
        template_detector(torch.rand(1, 3, 32, 30))
    with pytest.raises(ValueError, match="feature"):
        foreground(torch.rand(1, 3, 8, 8), "edges")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        foreground(torch.rand(1, 3, 8, 8), "contrast", 4)
    with pytest.raises(ValueError, match="circle_fill"):
        threshold_detector(torch.rand(1, 3, 8, 8), circle_fill=0.95, square_fill=0.9)
    with pytest.raises(ValueError, match="nms_iou"):
        template_detector(torch.rand(1, 3, 16, 16), nms_iou=0)
    with pytest.raises(ValueError, match="sizes"):
        template_detector(torch.rand(1, 3, 16, 16), sizes=[])
    with pytest.raises(ValueError, match="size"):
        template_scores(torch.rand(1, 3, 8, 8), 9)
    with pytest.raises(ValueError, match="mask"):
        connected_components(torch.rand(2, 4, 4))
