"""lecture_pkg.detection: the Hungarian algorithm against scipy's linear_sum_assignment, the
matcher against Hugging Face's HungarianMatcher (DETR's), boxes and GIoU against hand
computations and HF, the set loss against HF's ImageLoss, AP on hand cases, the data
generator's determinism, and clear errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from lecture_pkg.detection import (
    average_precision,
    box_area,
    box_cxcywh_to_xyxy,
    box_iou,
    box_xyxy_to_cxcywh,
    crowded_objects,
    detection_ap,
    detr_loss,
    duplicated_objects,
    found_objects,
    generalized_box_iou,
    hungarian,
    hungarian_match,
    match_cost,
    nms,
    synthetic_shapes,
)

scipy_optimize = pytest.importorskip("scipy.optimize")


def hf_detection():
    """HF's DETR matcher and loss (transformers >= 5 keeps them in transformers.loss; the
    module needs scipy, not timm). Skips with the import error when it cannot be imported."""
    try:
        from transformers.loss import loss_for_object_detection as hf
    except ImportError as error:  # pragma: no cover - depends on the installed transformers
        pytest.skip(f"transformers.loss.loss_for_object_detection does not import: {error}")
    return hf


def random_predictions(batch: int, queries: int, classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, queries, classes + 1, generator=g)
    boxes = torch.rand(batch, queries, 4, generator=g) * 0.5 + 0.2
    return logits, boxes


# ---------------------------------------------------------------------------------------------
# Hungarian algorithm
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (4, 9), (9, 4), (8, 8), (1, 6), (6, 1)])
@pytest.mark.parametrize("seed", range(5))
def test_hungarian_equals_scipy(shape: tuple[int, int], seed: int) -> None:
    cost = torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)
    rows, cols = hungarian(cost)
    ref_rows, ref_cols = scipy_optimize.linear_sum_assignment(cost.numpy())
    assert rows.tolist() == ref_rows.tolist() and cols.tolist() == ref_cols.tolist()
    assert cost[rows, cols].sum().item() == pytest.approx(cost[ref_rows, ref_cols].sum().item(),
                                                          abs=1e-12)


def test_hungarian_against_brute_force() -> None:
    cost = torch.randint(0, 4, (4, 5), generator=torch.Generator().manual_seed(3)).double()
    rows, cols = hungarian(cost)
    best = min(sum(cost[i, p[i]].item() for i in range(4))
               for p in itertools.permutations(range(5), 4))
    assert cost[rows, cols].sum().item() == best  # ties: the cost is what must be minimal
    assert len(set(cols.tolist())) == 4


def test_hungarian_hand_case() -> None:
    # greedy (row by row) would take 1 then 10 = 11; the optimum is 2 + 3 = 5
    cost = torch.tensor([[1.0, 2.0], [3.0, 10.0]])
    rows, cols = hungarian(cost)
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]


@pytest.mark.parametrize("bad, error", [(torch.zeros(3), ValueError),
                                        (torch.tensor([[1.0, float("nan")]]), ValueError),
                                        (torch.zeros(2, 2, dtype=torch.long), TypeError)])
def test_hungarian_rejects_bad_cost(bad: torch.Tensor, error: type) -> None:
    with pytest.raises(error, match="cost"):
        hungarian(bad)


# ---------------------------------------------------------------------------------------------
# Boxes
# ---------------------------------------------------------------------------------------------

def test_box_conversions_by_hand() -> None:
    xyxy = torch.tensor([[0.1, 0.2, 0.5, 0.8]])
    cxcywh = box_xyxy_to_cxcywh(xyxy)
    torch.testing.assert_close(cxcywh, torch.tensor([[0.3, 0.5, 0.4, 0.6]]))
    torch.testing.assert_close(box_cxcywh_to_xyxy(cxcywh), xyxy)
    torch.testing.assert_close(box_area(xyxy), torch.tensor([0.24]))


def test_iou_and_giou_by_hand() -> None:
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [4.0, 0.0, 6.0, 2.0], [0.0, 0.0, 2.0, 2.0]])
    iou, union = box_iou(a, b)
    # overlap 1, union 7; disjoint; identical
    torch.testing.assert_close(iou, torch.tensor([[1 / 7, 0.0, 1.0]]))
    torch.testing.assert_close(union, torch.tensor([[7.0, 8.0, 4.0]]))
    # enclosing boxes: 3x3 = 9 and 6x2 = 12
    expected = torch.tensor([[1 / 7 - (9 - 7) / 9, 0.0 - (12 - 8) / 12, 1.0]])
    torch.testing.assert_close(generalized_box_iou(a, b), expected)


def test_giou_equals_hf() -> None:
    hf = hf_detection()
    g = torch.Generator().manual_seed(0)
    a = box_cxcywh_to_xyxy(torch.rand(7, 4, generator=g) * 0.5 + 0.1)
    b = box_cxcywh_to_xyxy(torch.rand(5, 4, generator=g) * 0.5 + 0.1)
    torch.testing.assert_close(generalized_box_iou(a, b), hf.generalized_box_iou(a, b))
    torch.testing.assert_close(box_iou(a, b)[0], hf.box_iou(a, b)[0])


def test_boxes_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="last dim 4"):
        box_cxcywh_to_xyxy(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="x1 < x0"):
        box_iou(torch.tensor([[0.5, 0.0, 0.1, 1.0]]), torch.tensor([[0.0, 0.0, 1.0, 1.0]]))


# ---------------------------------------------------------------------------------------------
# Matching and loss
# ---------------------------------------------------------------------------------------------

def targets(seed: int = 1, batch: int = 3, classes: int = 3):
    data = synthetic_shapes(batch, generator=torch.Generator().manual_seed(seed))
    return data.classes, data.boxes


def test_match_equals_scipy_on_the_same_cost() -> None:
    logits, boxes = random_predictions(3, 8, 3)
    classes, tboxes = targets()
    for k, (q, t) in enumerate(hungarian_match(logits, boxes, classes, tboxes)):
        cost = match_cost(logits[k], boxes[k], classes[k], tboxes[k]).double().numpy()
        ref_q, ref_t = scipy_optimize.linear_sum_assignment(cost)
        assert q.tolist() == ref_q.tolist() and t.tolist() == ref_t.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_match_equals_hf_hungarian_matcher(seed: int) -> None:
    hf = hf_detection()
    logits, boxes = random_predictions(4, 8, 3, seed)
    classes, tboxes = targets(seed + 10, batch=4)
    matcher = hf.HungarianMatcher(class_cost=1, bbox_cost=5, giou_cost=2)
    expected = matcher({"logits": logits, "pred_boxes": boxes},
                       [{"class_labels": c, "boxes": b} for c, b in zip(classes, tboxes)])
    got = hungarian_match(logits, boxes, classes, tboxes)
    for (q, t), (ref_q, ref_t) in zip(got, expected):
        assert q.tolist() == ref_q.tolist() and t.tolist() == ref_t.tolist()


def test_loss_equals_hf_image_loss() -> None:
    hf = hf_detection()
    logits, boxes = random_predictions(4, 8, 3, seed=5)
    classes, tboxes = targets(7, batch=4)
    matcher = hf.HungarianMatcher(class_cost=1, bbox_cost=5, giou_cost=2)
    criterion = hf.ImageLoss(matcher, num_classes=3, eos_coef=0.1,
                             losses=["labels", "boxes"])
    expected = criterion({"logits": logits, "pred_boxes": boxes},
                         [{"class_labels": c, "boxes": b} for c, b in zip(classes, tboxes)])
    got = detr_loss(logits, boxes, classes, tboxes, eos_coef=0.1)
    torch.testing.assert_close(got["class"], expected["loss_ce"])
    torch.testing.assert_close(got["l1"], expected["loss_bbox"])
    torch.testing.assert_close(got["giou"], expected["loss_giou"])
    total = expected["loss_ce"] + 5 * expected["loss_bbox"] + 2 * expected["loss_giou"]
    torch.testing.assert_close(got["loss"], total)


def test_loss_by_hand_on_a_perfect_prediction() -> None:
    tboxes = [torch.tensor([[0.3, 0.3, 0.2, 0.2]])]
    classes = [torch.tensor([1])]
    boxes = torch.tensor([[[0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.1, 0.1]]])
    logits = torch.tensor([[[0.0, 20.0, 0.0, 0.0], [0.0, 0.0, 0.0, 20.0]]])
    out = detr_loss(logits, boxes, classes, tboxes)
    assert out["l1"].item() == pytest.approx(0.0, abs=1e-7)
    assert out["giou"].item() == pytest.approx(0.0, abs=1e-6)
    assert out["class"].item() < 1e-7
    # swapping the two queries' boxes costs the L1 and GIoU of the wrong box
    swapped = detr_loss(logits, boxes.flip(1), classes, tboxes)
    assert swapped["loss"].item() > out["loss"].item()


def test_no_object_weight() -> None:
    # one query, no objects: the class loss is the CE of "no object", whatever eos_coef is
    # (a weighted mean of one term); with an object present the weight changes the mean
    logits = torch.tensor([[[1.0, 0.0, 0.0, 0.5], [0.0, 2.0, 0.0, 0.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.2, 0.2]]])
    classes, tboxes = [torch.tensor([1])], [torch.tensor([[0.3, 0.3, 0.2, 0.2]])]
    ce = torch.nn.functional.cross_entropy
    for eos in (0.1, 1.0):
        got = detr_loss(logits, boxes, classes, tboxes, eos_coef=eos)["class"]
        terms = torch.stack([ce(logits[0, 0], torch.tensor(3)), ce(logits[0, 1],
                                                                  torch.tensor(1))])
        expected = (eos * terms[0] + terms[1]) / (eos + 1)
        torch.testing.assert_close(got, expected)


def test_match_and_loss_reject_bad_input() -> None:
    logits, boxes = random_predictions(2, 3, 3)
    classes, tboxes = targets(batch=2)
    with pytest.raises(ValueError, match="one entry per image"):
        hungarian_match(logits, boxes, classes[:1], tboxes[:1])
    with pytest.raises(ValueError, match="pred_boxes"):
        hungarian_match(logits, boxes[:, :2], classes, tboxes)
    many = [torch.zeros(5, dtype=torch.long)] * 2
    with pytest.raises(ValueError, match="only 3 queries"):
        hungarian_match(logits, boxes, many, [torch.full((5, 4), 0.3)] * 2)
    with pytest.raises(ValueError, match="eos_coef"):
        detr_loss(logits, boxes, classes, tboxes, eos_coef=2.0)


# ---------------------------------------------------------------------------------------------
# AP
# ---------------------------------------------------------------------------------------------

def box(cx: float, cy: float, w: float = 0.2, h: float = 0.2) -> list[float]:
    return [cx, cy, w, h]


def test_ap_perfect_and_empty() -> None:
    gt = [torch.tensor([box(0.3, 0.3), box(0.7, 0.7)])]
    cls = [torch.tensor([0, 2])]
    perfect = average_precision(gt, [torch.tensor([0.9, 0.8])], cls, gt, cls, 3)
    assert perfect["ap"] == 1.0
    none = average_precision([torch.zeros(0, 4)], [torch.zeros(0)],
                             [torch.zeros(0, dtype=torch.long)], gt, cls, 3)
    assert none["ap"] == 0.0


def test_ap_hand_case() -> None:
    # class 0, two objects. Detections by score: FP (0.9), TP (0.8), duplicate of the same
    # object (0.7, FP), TP (0.6). Precision at the hits: 1/2 and 2/4; recall 1/2 and 1.
    # The envelope makes both 1/2, so AP = 1/2 * 1/2 + 1/2 * 1/2 = 0.5.
    gt = [torch.tensor([box(0.2, 0.2), box(0.7, 0.7)])]
    gcls = [torch.tensor([0, 0])]
    pred = [torch.tensor([box(0.5, 0.2), box(0.2, 0.2), box(0.21, 0.2), box(0.7, 0.7)])]
    scores = [torch.tensor([0.9, 0.8, 0.7, 0.6])]
    pcls = [torch.tensor([0, 0, 0, 0])]
    assert average_precision(pred, scores, pcls, gt, gcls, 1)["ap"] == pytest.approx(0.5)
    # Ranking the duplicate and the miss last: hits at ranks 1 and 2, AP = 1
    scores = [torch.tensor([0.1, 0.8, 0.05, 0.6])]
    assert average_precision(pred, scores, pcls, gt, gcls, 1)["ap"] == pytest.approx(1.0)


def test_ap_iou_threshold_and_class() -> None:
    gt = [torch.tensor([box(0.5, 0.5, 0.4, 0.4)])]
    gcls = [torch.tensor([1])]
    shifted = [torch.tensor([box(0.6, 0.5, 0.4, 0.4)])]  # IoU = 0.3 * 0.4 / (0.32 - 0.12) = 0.6
    one = [torch.tensor([1.0])]
    assert average_precision(shifted, one, gcls, gt, gcls, 3, 0.5)["ap"] == 1.0
    assert average_precision(shifted, one, gcls, gt, gcls, 3, 0.7)["ap"] == 0.0
    wrong_class = [torch.tensor([2])]
    assert average_precision(shifted, one, wrong_class, gt, gcls, 3)["ap"] == 0.0


def test_detection_ap_sends_images_to_the_models_device() -> None:
    # a stand-in for DETR whose weights sit on the meta device: detection_ap must hand it
    # images on that device (the CPU ones would fail on a GPU) and bring its CPU detections
    # to the targets
    gt = [torch.tensor([box(0.3, 0.3)]), torch.tensor([box(0.7, 0.7)])]
    cls = [torch.tensor([0]), torch.tensor([1])]

    class OnMeta(torch.nn.Module):
        config = type("Config", (), {"num_classes": 2})()

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))
            self.seen: list[torch.device] = []

        def predict(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
            self.seen.append(images.device)
            rows = slice(len(self.seen) - 1, len(self.seen))  # batch_size=1: one image
            return (torch.stack(gt)[rows], torch.ones(1, 1),
                    torch.stack(cls)[rows])

    model = OnMeta()
    result = detection_ap(model, torch.zeros(2, 3, 8, 8), gt, cls, batch_size=1)
    assert model.seen == [torch.device("meta")] * 2 and not model.training
    assert result["ap"] == 1.0


def test_ap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="iou_threshold"):
        average_precision([], [], [], [], [], 3, iou_threshold=0.0)
    with pytest.raises(ValueError, match="one entry per image"):
        average_precision([torch.zeros(0, 4)], [], [], [], [], 3)


def test_duplicated_objects_hand_case() -> None:
    # object 0 (class 0) is answered twice by confident boxes of its class; object 1
    # (class 1) once confidently, once with a low score and once by the wrong class
    gt = torch.tensor([box(0.3, 0.3), box(0.7, 0.7)])
    gcls = torch.tensor([0, 1])
    pred = torch.tensor([box(0.3, 0.3), box(0.31, 0.3), box(0.7, 0.7), box(0.7, 0.71),
                         box(0.71, 0.7)])
    scores = torch.tensor([0.9, 0.8, 0.9, 0.3, 0.9])
    pcls = torch.tensor([0, 0, 1, 1, 2])
    assert duplicated_objects(pred, scores, pcls, gt, gcls).tolist() == [True, False]
    # lowering the score threshold lets the 0.3 box count: object 1 is answered twice
    assert duplicated_objects(pred, scores, pcls, gt, gcls,
                              score_threshold=0.2).tolist() == [True, True]
    # a second box that misses the object (IoU 0.6 * 0.2 / 0.28 = 0.43 < 0.5) is no duplicate
    far = torch.tensor([box(0.3, 0.3), box(0.38, 0.3)])
    assert duplicated_objects(far, scores[:2], pcls[:2], gt, gcls).tolist() == [False, False]
    none = duplicated_objects(torch.zeros(0, 4), torch.zeros(0),
                              torch.zeros(0, dtype=torch.long), gt, gcls)
    assert none.tolist() == [False, False]


def test_duplicated_objects_equals_a_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        d, k = int(torch.randint(0, 12, (1,), generator=gen)), 4
        pred = torch.cat([torch.rand(d, 2, generator=gen),
                          0.1 + 0.3 * torch.rand(d, 2, generator=gen)], 1)
        gt = torch.cat([torch.rand(k, 2, generator=gen),
                        0.1 + 0.3 * torch.rand(k, 2, generator=gen)], 1)
        scores = torch.rand(d, generator=gen)
        pcls = torch.randint(0, 2, (d,), generator=gen)
        gcls = torch.randint(0, 2, (k,), generator=gen)
        iou = box_iou(box_cxcywh_to_xyxy(pred), box_cxcywh_to_xyxy(gt))[0]
        expected = [sum(1 for i in range(d) if scores[i] > 0.5 and pcls[i] == gcls[j]
                        and iou[i, j] >= 0.5) >= 2 for j in range(k)]
        assert duplicated_objects(pred, scores, pcls, gt, gcls).tolist() == expected


def test_found_objects_keeps_only_as_many_guesses_as_objects() -> None:
    gt = torch.tensor([box(0.3, 0.3), box(0.7, 0.7)])
    gcls = torch.tensor([0, 1])
    # the two best are a hit on object 0 and a box far from everything; the hit on object 1
    # is third, so with two guesses object 1 is not found
    pred = torch.tensor([box(0.3, 0.3), box(0.1, 0.9), box(0.7, 0.7)])
    scores = torch.tensor([0.9, 0.8, 0.7])
    pcls = torch.tensor([0, 0, 1])
    assert found_objects(pred, scores, pcls, gt, gcls).tolist() == [True, False]
    assert found_objects(pred, scores[[0, 2, 1]], pcls, gt, gcls).tolist() == [True, True]
    # the right place but the wrong class is not a find, nor is a loose box (IoU 0.43)
    assert found_objects(pred, scores, torch.tensor([1, 0, 1]), gt,
                         gcls).tolist() == [False, False]
    loose = torch.tensor([box(0.38, 0.3), box(0.7, 0.7)])
    assert found_objects(loose, scores[:2], torch.tensor([0, 1]), gt,
                         gcls).tolist() == [False, True]
    none = found_objects(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.long),
                         gt, gcls)
    assert none.tolist() == [False, False]
    with pytest.raises(ValueError, match="target_classes"):
        found_objects(pred, scores, pcls, gt, torch.tensor([0]))


def test_crowded_objects_are_those_whose_box_shares_area() -> None:
    # 0 and 1 overlap; 2 touches 1 only along an edge (no shared area); 3 is alone
    boxes = box_xyxy_to_cxcywh(torch.tensor([[0.0, 0.0, 0.2, 0.2], [0.1, 0.1, 0.3, 0.3],
                                             [0.3, 0.1, 0.5, 0.3], [0.7, 0.7, 0.9, 0.9]]))
    assert crowded_objects(boxes).tolist() == [True, True, False, False]
    assert crowded_objects(boxes[3:]).tolist() == [False]
    assert crowded_objects(torch.zeros(0, 4)).tolist() == []


def test_nms_hand_case_and_properties() -> None:
    pred = torch.tensor([box(0.3, 0.3), box(0.31, 0.3), box(0.3, 0.3), box(0.7, 0.7)])
    scores = torch.tensor([0.8, 0.9, 0.7, 0.6])
    pcls = torch.tensor([0, 0, 1, 0])
    # box 1 (0.9) suppresses box 0 (same class, IoU 0.9); box 2 has another class
    assert nms(pred, scores, pcls).tolist() == [1, 2, 3]
    assert nms(pred, scores, pcls, iou_threshold=0.95).tolist() == [1, 0, 2, 3]
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        d = 15
        boxes = torch.cat([torch.rand(d, 2, generator=gen),
                           0.1 + 0.3 * torch.rand(d, 2, generator=gen)], 1)
        scores = torch.rand(d, generator=gen)
        classes = torch.randint(0, 2, (d,), generator=gen)
        kept = nms(boxes, scores, classes).tolist()
        iou = box_iou(*(2 * (box_cxcywh_to_xyxy(boxes),)))[0]
        for a in kept:  # no two kept boxes of a class overlap above the threshold
            assert all(classes[a] != classes[b] or iou[a, b] <= 0.5 for b in kept if b != a)
        for i in set(range(d)) - set(kept):  # each removed box has a better kept cover
            assert any(classes[a] == classes[i] and iou[a, i] > 0.5 and scores[a] >= scores[i]
                       for a in kept)
    with pytest.raises(ValueError, match="pred_scores"):
        nms(pred, scores[:2], pcls)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def test_generator_is_deterministic_and_well_formed() -> None:
    a = synthetic_shapes(20, generator=torch.Generator().manual_seed(4))
    b = synthetic_shapes(20, generator=torch.Generator().manual_seed(4))
    c = synthetic_shapes(20, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.images, b.images)
    assert all(torch.equal(x, y) for x, y in zip(a.boxes, b.boxes))
    assert all(torch.equal(x, y) for x, y in zip(a.classes, b.classes))
    assert not torch.equal(a.images, c.images)
    assert a.images.shape == (20, 3, 32, 32)
    assert 0.0 <= a.images.min() and a.images.max() <= 1.0
    for boxes, classes in zip(a.boxes, a.classes):
        assert 1 <= len(boxes) <= 4 and boxes.shape == (len(classes), 4)
        xyxy = box_cxcywh_to_xyxy(boxes)
        assert (xyxy >= 0).all() and (xyxy <= 1).all()
        iou = box_iou(xyxy, xyxy)[0]
        assert torch.equal(iou > 0, torch.eye(len(boxes), dtype=torch.bool))  # no overlaps
        assert set(classes.tolist()) <= {0, 1, 2}


def test_generator_draws_each_shape_inside_its_box() -> None:
    data = synthetic_shapes(30, generator=torch.Generator().manual_seed(6))
    for image, boxes in zip(data.images, data.boxes):
        lit = image.max(0).values > 0.1  # the background is below 0.08
        inside = torch.zeros_like(lit)
        for x0, y0, x1, y1 in (box_cxcywh_to_xyxy(boxes) * 32).round().long().tolist():
            assert lit[y0:y1, x0:x1].any()
            inside[y0:y1, x0:x1] = True
        assert not (lit & ~inside).any()


def test_generator_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_size"):
        synthetic_shapes(2, image_size=16, max_size=12)
    with pytest.raises(ValueError, match="n must be positive"):
        synthetic_shapes(0)
