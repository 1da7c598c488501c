"""Object detection as set prediction (DETR, Carion et al., 2020) on synthetic shapes (chapter
8.3): data, boxes, matching, loss, the AP metric and the book's shipped DETR. The model itself is
in :mod:`lecture_pkg.models.detr`; detectors that learn nothing, the baselines, are in
:mod:`lecture_pkg.classical_detection`.

1. :func:`synthetic_shapes`: images of 1-4 coloured squares, circles and triangles with their
   boxes and classes, separated on a dark background (a threshold solves them exactly), and
   :func:`cluttered_shapes`: 1-5 shapes that touch and overlap on a textured background
   crossed by lines (the task the page and the shipped DETR use); both deterministic from a
   ``torch.Generator`` and listed by name in :data:`SCENES`;
2. box arithmetic: corner/centre conversions, pairwise IoU and generalised IoU (GIoU);
3. :func:`hungarian`: the Hungarian algorithm (Kuhn-Munkres with potentials, O(n^2 m)) for a
   rectangular cost matrix, and :func:`hungarian_match`: DETR's one-to-one matching of queries
   to objects on a cost of class probability, L1 box distance and GIoU;
4. :func:`detr_loss`: cross-entropy over every query (the unmatched ones must say "no object",
   whose weight is ``eos_coef``) plus L1 and GIoU on the matched boxes;
5. :func:`average_precision`: box AP at one IoU threshold, averaged over classes (all-point
   interpolation of the precision-recall curve); :func:`duplicated_objects` (objects answered
   more than once), :func:`found_objects` (objects found among as many best detections as
   there are objects) with :func:`crowded_objects` (boxes that overlap another's), and
   :func:`nms` (greedy non-maximum suppression, for comparison);
6. a DETR trained and measured with them: :func:`set_loss` (the loss at every decoder layer),
   :func:`detection_ap` (a model's AP on held-out images), and :func:`load_shapes_detr`, the
   checkpoint that ``scripts/train_detr.py`` trains longer on :func:`cluttered_shapes`.

Boxes are ``(cx, cy, w, h)`` normalised by the image size unless a name says ``xyxy``
(``(x0, y0, x1, y1)``). Classes are ``0 .. num_classes - 1``; the model's extra last logit is
"no object".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.models.detr import DETR, DETRConfig, DETROutput
from lecture_pkg.shipped import Shipped, shipped_info, shipped_state

__all__ = [
    "CHECKPOINT",
    "CLASS_NAMES",
    "SCENES",
    "Scenes",
    "ShapesData",
    "average_precision",
    "box_area",
    "box_cxcywh_to_xyxy",
    "box_iou",
    "box_xyxy_to_cxcywh",
    "cluttered_shapes",
    "crowded_objects",
    "detection_ap",
    "detr_loss",
    "duplicated_objects",
    "found_objects",
    "generalized_box_iou",
    "hungarian",
    "hungarian_match",
    "load_shapes_detr",
    "match_cost",
    "nms",
    "set_loss",
    "shapes_detr_info",
    "synthetic_shapes",
]

CHECKPOINT = "detr_shapes"  # written by scripts/train_detr.py
CLASS_NAMES = ("square", "circle", "triangle")
_PALETTE = torch.tensor([[0.95, 0.25, 0.2], [0.2, 0.75, 0.3], [0.25, 0.45, 0.95],
                         [0.95, 0.8, 0.2], [0.85, 0.35, 0.85], [0.3, 0.85, 0.9]])


# --------------------------------------------------------------------------------------------
# 1. Data
# --------------------------------------------------------------------------------------------

class ShapesData(NamedTuple):
    """images: (n, 3, size, size) in [0, 1]; boxes[i]: (k_i, 4) normalised cxcywh;
    classes[i]: (k_i,) int64 indices into :data:`CLASS_NAMES`."""

    images: Tensor
    boxes: list[Tensor]
    classes: list[Tensor]


def _shape_mask(kind: int, x0: int, y0: int, s: int, size: int) -> Tensor:
    """The pixels (size, size) of a shape in the square [x0, x0+s) x [y0, y0+s)."""
    centres = torch.arange(size, dtype=torch.float32) + 0.5
    y, x = centres[:, None], centres[None, :]
    inside = (x >= x0) & (x <= x0 + s) & (y >= y0) & (y <= y0 + s)
    if kind == 1:  # circle inscribed in the square
        r = s / 2
        return (x - x0 - r) ** 2 + (y - y0 - r) ** 2 <= r * r
    if kind == 2:  # triangle: apex at the top middle, base along the bottom edge
        return inside & ((x - x0 - s / 2).abs() <= (y - y0) / 2)
    return inside


def synthetic_shapes(n: int, image_size: int = 32, generator: torch.Generator | None = None,
                     max_objects: int = 4, min_size: int = 6,
                     max_size: int = 12) -> ShapesData:
    """``n`` images of 1..``max_objects`` non-overlapping shapes on a dark, slightly noisy
    background. Each shape has a random class (square, circle, triangle), side length in
    [min_size, max_size] pixels, position and colour (colour says nothing about the class).
    The box of a shape is its bounding square. Same generator state, same data."""
    check_int("n", n, minimum=1)
    check_int("image_size", image_size, minimum=8)
    check_int("max_objects", max_objects, minimum=1)
    check_int("min_size", min_size, minimum=2)
    check_int("max_size", max_size, minimum=min_size)
    if max_size > image_size // 2:
        raise ValueError(f"max_size must be at most image_size // 2 = {image_size // 2}, "
                         f"got {max_size}")
    g = generator

    def randint(low: int, high: int) -> int:  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=g))

    images = 0.08 * torch.rand(n, 3, image_size, image_size, generator=g)
    all_boxes, all_classes = [], []
    for i in range(n):
        placed: list[tuple[int, int, int]] = []
        kinds: list[int] = []
        for _ in range(randint(1, max_objects)):
            kind, s = randint(0, len(CLASS_NAMES) - 1), randint(min_size, max_size)
            colour = _PALETTE[randint(0, len(_PALETTE) - 1)]
            for _attempt in range(30):  # rejection sampling: no two boxes touch
                x0, y0 = randint(0, image_size - s), randint(0, image_size - s)
                if all(x0 + s < a or a + b < x0 or y0 + s < c or c + b < y0
                       for a, c, b in placed):
                    break
            else:
                continue
            mask = _shape_mask(kind, x0, y0, s, image_size)
            images[i][:, mask] = colour[:, None]
            placed.append((x0, y0, s))
            kinds.append(kind)
        xyxy = torch.tensor([[x0, y0, x0 + s, y0 + s] for x0, y0, s in placed],
                            dtype=torch.float32) / image_size
        all_boxes.append(box_xyxy_to_cxcywh(xyxy))
        all_classes.append(torch.tensor(kinds, dtype=torch.long))
    return ShapesData(images, all_boxes, all_classes)


class Scenes(NamedTuple):
    """images: (n, 3, size, size) in [0, 1]; boxes[i]: (k_i, 4) normalised cxcywh (each
    object's whole bounding square, also where something covers part of it);
    classes[i]: (k_i,) int64 indices into :data:`CLASS_NAMES`; visible[i]: (k_i, size, size)
    bool, the pixels of each object that nothing drawn later covers."""

    images: Tensor
    boxes: list[Tensor]
    classes: list[Tensor]
    visible: list[Tensor]


def _stroke_mask(x0: float, y0: float, x1: float, y1: float, size: int) -> Tensor:
    """(size, size) bool: the pixels a one-pixel line from (x0, y0) to (x1, y1) passes."""
    steps = int(2 * max(abs(x1 - x0), abs(y1 - y0))) + 2
    t = torch.linspace(0, 1, steps)
    xs = (x0 + t * (x1 - x0)).floor().long().clamp(0, size - 1)
    ys = (y0 + t * (y1 - y0)).floor().long().clamp(0, size - 1)
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[ys, xs] = True
    return mask


def cluttered_shapes(n: int, image_size: int = 32, generator: torch.Generator | None = None,
                     max_objects: int = 5, min_size: int = 5, max_size: int = 14,
                     max_overlap: float = 0.4, min_visible: float = 0.6, strokes: int = 6,
                     texture: float = 0.45, noise: float = 0.05,
                     min_brightness: float = 0.45) -> Scenes:
    """``n`` scenes that a fixed threshold cannot take apart: 1..``max_objects`` squares,
    circles and triangles (side in [min_size, max_size] px, colour from a palette times a
    brightness in [min_brightness, 1]) that may touch and overlap (box IoU up to
    ``max_overlap``; a later shape covers an earlier one, which keeps at least ``min_visible``
    of its pixels; overlapping shapes differ in colour), on a smooth coloured texture of
    amplitude ``texture``, with ``strokes`` one-pixel lines in the palette's colours (half
    behind the shapes, half across them) and Gaussian pixel noise of std ``noise``.

    The box of a shape is its whole bounding square (as for :func:`synthetic_shapes`), also
    where it is partly covered. Same generator state, same scenes."""
    check_int("n", n, minimum=1)
    check_int("image_size", image_size, minimum=8)
    check_int("max_objects", max_objects, minimum=1)
    check_int("min_size", min_size, minimum=3)
    check_int("max_size", max_size, minimum=min_size)
    check_int("strokes", strokes, minimum=0)
    if max_size > image_size // 2:
        raise ValueError(f"max_size must be at most image_size // 2 = {image_size // 2}, "
                         f"got {max_size}")
    for name, value, low, high in (("max_overlap", max_overlap, 0.0, 1.0),
                                   ("min_visible", min_visible, 0.0, 1.0),
                                   ("texture", texture, 0.0, 1.0), ("noise", noise, 0.0, 1.0),
                                   ("min_brightness", min_brightness, 0.05, 1.0)):
        if not (isinstance(value, (int, float)) and low <= value <= high):
            raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    g, size = generator, image_size

    def randint(low: int, high: int) -> int:  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=g))

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=g))

    def stroke() -> tuple[Tensor, Tensor]:
        x0, y0 = uniform(0, size), uniform(0, size)
        angle, length = uniform(0, math.pi), uniform(size / 5, size / 1.5)
        mask = _stroke_mask(x0, y0, x0 + length * math.cos(angle),
                            y0 + length * math.sin(angle), size)
        return mask, _PALETTE[randint(0, len(_PALETTE) - 1)] * uniform(min_brightness, 1.0)

    coarse = torch.rand(n, 3, 5, 5, generator=g)
    base = 0.25 * torch.rand(n, 1, 1, 1, generator=g)
    images = base + texture * F.interpolate(coarse, size=(size, size), mode="bicubic",
                                            align_corners=True).clamp(0, 1)
    all_boxes, all_classes, all_visible = [], [], []
    for i in range(n):
        image = images[i]
        for _ in range(strokes // 2):  # behind the shapes
            mask, colour = stroke()
            image[:, mask] = colour[:, None]
        placed: list[tuple[int, int, int]] = []
        kinds: list[int] = []
        colours: list[int] = []
        visible: list[Tensor] = []  # what is still seen of each shape
        fulls: list[Tensor] = []  # each shape's own pixels
        for _ in range(randint(1, max_objects)):
            kind, s = randint(0, len(CLASS_NAMES) - 1), randint(min_size, max_size)
            for _attempt in range(30):  # rejection sampling: bounded overlap, enough visible
                x0, y0 = randint(0, size - s), randint(0, size - s)
                box = torch.tensor([[x0, y0, x0 + s, y0 + s]], dtype=torch.float32)
                if placed:
                    others = torch.tensor([[a, c, a + b, c + b] for a, c, b in placed],
                                          dtype=torch.float32)
                    if float(box_iou(box, others)[0].max()) > max_overlap:
                        continue
                mask = _shape_mask(kind, x0, y0, s, size)
                if all(int((v & ~mask).sum()) >= min_visible * int(full.sum())
                       for v, full in zip(visible, fulls)):
                    break
            else:
                continue
            touching = {colours[j] for j, (a, c, b) in enumerate(placed)
                        if not (x0 + s < a or a + b < x0 or y0 + s < c or c + b < y0)}
            choices = [k for k in range(len(_PALETTE)) if k not in touching]
            colour = choices[randint(0, len(choices) - 1)]
            image[:, mask] = _PALETTE[colour][:, None] * uniform(min_brightness, 1.0)
            visible = [v & ~mask for v in visible]
            fulls.append(mask)
            visible.append(mask.clone())
            placed.append((x0, y0, s))
            kinds.append(kind)
            colours.append(colour)
        for _ in range(strokes - strokes // 2):  # across the shapes, never hiding too much
            mask, colour = stroke()
            if all(int((v & ~mask).sum()) >= min_visible * int(full.sum())
                   for v, full in zip(visible, fulls)):
                image[:, mask] = colour[:, None]
                visible = [v & ~mask for v in visible]
        xyxy = torch.tensor([[x0, y0, x0 + s, y0 + s] for x0, y0, s in placed],
                            dtype=torch.float32).reshape(-1, 4) / size
        all_boxes.append(box_xyxy_to_cxcywh(xyxy))
        all_classes.append(torch.tensor(kinds, dtype=torch.long))
        all_visible.append(torch.stack(visible) if visible
                           else torch.zeros(0, size, size, dtype=torch.bool))
    images = (images + noise * torch.randn(images.shape, generator=g)).clamp(0, 1)
    return Scenes(images, all_boxes, all_classes, all_visible)


SCENES = {"shapes": synthetic_shapes, "cluttered": cluttered_shapes}  # the two tasks, by name


# --------------------------------------------------------------------------------------------
# 2. Boxes
# --------------------------------------------------------------------------------------------

def _check_boxes(name: str, boxes: object) -> Tensor:
    boxes = check_float_tensor(name, boxes)
    if boxes.dim() < 1 or boxes.shape[-1] != 4:
        raise ValueError(f"{name} must have last dim 4, got shape {tuple(boxes.shape)}")
    return boxes


def box_cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """(..., 4) centre, width, height -> (..., 4) corners."""
    cx, cy, w, h = _check_boxes("boxes", boxes).unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def box_xyxy_to_cxcywh(boxes: Tensor) -> Tensor:
    """(..., 4) corners -> (..., 4) centre, width, height."""
    x0, y0, x1, y1 = _check_boxes("boxes", boxes).unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def box_area(boxes_xyxy: Tensor) -> Tensor:
    """(..., 4) corners -> (...) areas."""
    b = _check_boxes("boxes_xyxy", boxes_xyxy)
    return (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])


def _check_corners(name: str, boxes: Tensor) -> None:
    if boxes.dim() != 2:
        raise ValueError(f"{name} must be (n, 4), got shape {tuple(boxes.shape)}")
    if bool(((boxes[:, 2:] < boxes[:, :2]) & boxes.isfinite().all(-1, keepdim=True)).any()):
        raise ValueError(f"{name} has a box with x1 < x0 or y1 < y0 (expected x0, y0, x1, y1)")


def box_iou(a_xyxy: Tensor, b_xyxy: Tensor) -> tuple[Tensor, Tensor]:
    """Pairwise intersection over union. a: (n, 4), b: (m, 4) corners -> (iou (n, m),
    union (n, m))."""
    _check_corners("a_xyxy", _check_boxes("a_xyxy", a_xyxy))
    _check_corners("b_xyxy", _check_boxes("b_xyxy", b_xyxy))
    top_left = torch.maximum(a_xyxy[:, None, :2], b_xyxy[None, :, :2])
    bottom_right = torch.minimum(a_xyxy[:, None, 2:], b_xyxy[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    union = box_area(a_xyxy)[:, None] + box_area(b_xyxy)[None, :] - inter
    return inter / union, union


def generalized_box_iou(a_xyxy: Tensor, b_xyxy: Tensor) -> Tensor:
    """Pairwise GIoU = IoU - (|C| - |A u B|) / |C|, C the smallest box enclosing both.
    a: (n, 4), b: (m, 4) corners -> (n, m) in [-1, 1]."""
    iou, union = box_iou(a_xyxy, b_xyxy)
    top_left = torch.minimum(a_xyxy[:, None, :2], b_xyxy[None, :, :2])
    bottom_right = torch.maximum(a_xyxy[:, None, 2:], b_xyxy[None, :, 2:])
    enclosing = (bottom_right - top_left).clamp(min=0).prod(-1)
    return iou - (enclosing - union) / enclosing


# --------------------------------------------------------------------------------------------
# 3. Matching
# --------------------------------------------------------------------------------------------

def hungarian(cost: Tensor) -> tuple[Tensor, Tensor]:
    """Minimum-cost one-to-one assignment for a (n, m) cost matrix, as
    ``scipy.optimize.linear_sum_assignment``: returns (rows, cols), each (min(n, m),) int64,
    rows ascending; ``cost[rows, cols].sum()`` is minimal.

    Kuhn-Munkres with row and column potentials u, v (reduced cost c_ij - u_i - v_j >= 0): rows
    are added one at a time and each grows a shortest augmenting path (Dijkstra on reduced
    costs), so n rows cost O(n^2 m). Runs in float64 on the CPU."""
    cost = check_float_tensor("cost", cost)
    if cost.dim() != 2:
        raise ValueError(f"cost must be 2-D (n, m), got shape {tuple(cost.shape)}")
    if not bool(cost.isfinite().all()):
        raise ValueError("cost must be finite")
    transposed = cost.shape[0] > cost.shape[1]
    c = (cost.T if transposed else cost).detach().to("cpu", torch.float64).tolist()
    n, m = len(c), len(c[0]) if c else 0
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    owner = [0] * (m + 1)  # owner[j]: the row (1-based) holding column j; column 0 is a dummy
    for i in range(1, n + 1):
        owner[0], j0 = i, 0
        dist, way, used = [math.inf] * (m + 1), [0] * (m + 1), [False] * (m + 1)
        while owner[j0] != 0:  # grow the shortest path until it reaches a free column
            used[j0] = True
            i0, delta, j1 = owner[j0], math.inf, 0
            for j in range(1, m + 1):
                if not used[j]:
                    reduced = c[i0 - 1][j - 1] - u[i0] - v[j]
                    if reduced < dist[j]:
                        dist[j], way[j] = reduced, j0
                    if dist[j] < delta:
                        delta, j1 = dist[j], j
            for j in range(m + 1):
                if used[j]:
                    u[owner[j]] += delta
                    v[j] -= delta
                else:
                    dist[j] -= delta
            j0 = j1
        while j0:  # flip the path
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    pairs = sorted((owner[j] - 1, j - 1) for j in range(1, m + 1) if owner[j])
    rows = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    cols = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    if transposed:
        order = torch.argsort(cols)
        rows, cols = cols[order], rows[order]
    return rows, cols


def _check_targets(classes: list[Tensor], boxes: list[Tensor], batch: int) -> None:
    if len(classes) != batch or len(boxes) != batch:
        raise ValueError(f"target_classes and target_boxes must hold one entry per image "
                         f"({batch}), got {len(classes)} and {len(boxes)}")
    for k, (c, b) in enumerate(zip(classes, boxes)):
        _check_boxes(f"target_boxes[{k}]", b)
        if c.shape != b.shape[:1]:
            raise ValueError(f"target_classes[{k}] has shape {tuple(c.shape)} but "
                             f"target_boxes[{k}] holds {b.shape[0]} boxes")


def _check_predictions(logits: Tensor, boxes: Tensor) -> None:
    check_float_tensor("logits", logits)
    _check_boxes("pred_boxes", boxes)
    if logits.dim() != 3 or boxes.shape != (*logits.shape[:2], 4):
        raise ValueError(f"logits must be (batch, queries, classes + 1) and pred_boxes "
                         f"(batch, queries, 4), got {tuple(logits.shape)} and "
                         f"{tuple(boxes.shape)}")


def match_cost(logits: Tensor, pred_boxes: Tensor, target_classes: Tensor,
               target_boxes: Tensor, class_weight: float = 1.0, l1_weight: float = 5.0,
               giou_weight: float = 2.0) -> Tensor:
    """DETR's matching cost for one image: (queries, objects) =
    - class_weight * p(class of the object) + l1_weight * L1(boxes) - giou_weight * GIoU.

    logits: (queries, classes + 1); pred_boxes: (queries, 4); target_classes: (objects,);
    target_boxes: (objects, 4), both box sets normalised cxcywh."""
    prob = logits.softmax(-1)[:, target_classes]
    l1 = torch.cdist(pred_boxes, target_boxes, p=1)
    giou = generalized_box_iou(box_cxcywh_to_xyxy(pred_boxes), box_cxcywh_to_xyxy(target_boxes))
    return -class_weight * prob + l1_weight * l1 - giou_weight * giou


@torch.no_grad()
def hungarian_match(logits: Tensor, pred_boxes: Tensor, target_classes: list[Tensor],
                    target_boxes: list[Tensor], class_weight: float = 1.0,
                    l1_weight: float = 5.0,
                    giou_weight: float = 2.0) -> list[tuple[Tensor, Tensor]]:
    """Per image, the (query indices, object indices) of the minimum-cost matching under
    :func:`match_cost`; every object gets one query, the other queries get none.

    logits: (batch, queries, classes + 1); pred_boxes: (batch, queries, 4);
    target_classes[i]: (k_i,); target_boxes[i]: (k_i, 4). Needs k_i <= queries."""
    _check_predictions(logits, pred_boxes)
    _check_targets(target_classes, target_boxes, logits.shape[0])
    out = []
    for lg, pb, tc, tb in zip(logits, pred_boxes, target_classes, target_boxes):
        if tb.shape[0] > lg.shape[0]:
            raise ValueError(f"an image has {tb.shape[0]} objects but there are only "
                             f"{lg.shape[0]} queries")
        cost = match_cost(lg.float(), pb.float(), tc, tb.float(), class_weight, l1_weight,
                          giou_weight)
        out.append(hungarian(cost))
    return out


# --------------------------------------------------------------------------------------------
# 4. Loss
# --------------------------------------------------------------------------------------------

def detr_loss(logits: Tensor, pred_boxes: Tensor, target_classes: list[Tensor],
              target_boxes: list[Tensor], indices: list[tuple[Tensor, Tensor]] | None = None,
              eos_coef: float = 0.1, class_weight: float = 1.0, l1_weight: float = 5.0,
              giou_weight: float = 2.0) -> dict[str, Tensor]:
    """DETR's set loss after matching (``indices`` from :func:`hungarian_match`, computed here
    when None):

    - ``class``: cross-entropy over all queries, the target of an unmatched query being the
      last class ("no object"), whose weight is ``eos_coef`` (a weighted mean, as torch's
      ``cross_entropy`` with ``weight`` computes it);
    - ``l1`` and ``giou``: sum over matched pairs of L1(box) and 1 - GIoU, divided by the
      number of objects in the batch;
    - ``loss`` = class_weight * class + l1_weight * l1 + giou_weight * giou.

    Shapes as in :func:`hungarian_match`. Returns scalars."""
    _check_predictions(logits, pred_boxes)
    _check_targets(target_classes, target_boxes, logits.shape[0])
    if not 0.0 <= eos_coef <= 1.0:
        raise ValueError(f"eos_coef must be in [0, 1], got {eos_coef}")
    if indices is None:
        indices = hungarian_match(logits, pred_boxes, target_classes, target_boxes,
                                  class_weight, l1_weight, giou_weight)
    batch, queries, num_logits = logits.shape
    device = logits.device
    image = torch.cat([torch.full_like(q, k) for k, (q, _) in enumerate(indices)]).to(device)
    query = torch.cat([q for q, _ in indices]).to(device)
    matched_classes = torch.cat([c[t] for c, (_, t) in zip(target_classes, indices)]).to(device)
    matched_boxes = torch.cat([b[t] for b, (_, t) in zip(target_boxes, indices)]).to(device)
    target = torch.full((batch, queries), num_logits - 1, dtype=torch.long, device=device)
    target[image, query] = matched_classes
    weight = torch.ones(num_logits, device=device, dtype=logits.dtype)
    weight[-1] = eos_coef
    loss_class = F.cross_entropy(logits.transpose(1, 2), target, weight=weight)
    num_boxes = max(sum(len(b) for b in target_boxes), 1)
    boxes = pred_boxes[image, query]
    loss_l1 = (boxes - matched_boxes).abs().sum() / num_boxes
    giou = generalized_box_iou(box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(matched_boxes))
    loss_giou = (1 - giou.diagonal()).sum() / num_boxes
    total = class_weight * loss_class + l1_weight * loss_l1 + giou_weight * loss_giou
    return {"loss": total, "class": loss_class, "l1": loss_l1, "giou": loss_giou}


# --------------------------------------------------------------------------------------------
# 5. Metric
# --------------------------------------------------------------------------------------------

def average_precision(pred_boxes: list[Tensor], pred_scores: list[Tensor],
                      pred_classes: list[Tensor], target_boxes: list[Tensor],
                      target_classes: list[Tensor], num_classes: int,
                      iou_threshold: float = 0.5) -> dict[str, float]:
    """Box AP at one IoU threshold (PASCAL VOC's all-point AP; COCO's AP50 differs only in
    sampling the curve at 101 recall points), averaged over the classes that have objects.

    Per image i: pred_boxes[i] (d_i, 4) cxcywh, pred_scores[i] (d_i,), pred_classes[i] (d_i,);
    target_boxes[i] (k_i, 4), target_classes[i] (k_i,). Per class, detections are taken in
    descending score over all images; one is a true positive when its IoU with a not yet
    claimed object of its class in its image is >= ``iou_threshold`` (the best such object is
    claimed), else a false positive. AP is the area under the precision-recall curve after
    making precision non-increasing. Returns {"ap": mean, "ap_<class>": per class}."""
    check_int("num_classes", num_classes, minimum=1)
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
    n = len(target_boxes)
    if not len(pred_boxes) == len(pred_scores) == len(pred_classes) == len(target_classes) == n:
        raise ValueError("pred_boxes, pred_scores, pred_classes, target_boxes and "
                         "target_classes must hold one entry per image")
    # every prediction against every object of its image, for all images at once (padded)
    most_pred = max([len(b) for b in pred_boxes] + [1])
    most_gt = max([len(b) for b in target_boxes] + [1])
    pred = torch.zeros(n, most_pred, 4)
    gt = torch.zeros(n, most_gt, 4)
    for i in range(n):
        pred[i, :len(pred_boxes[i])] = box_cxcywh_to_xyxy(pred_boxes[i].float().reshape(-1, 4))
        gt[i, :len(target_boxes[i])] = box_cxcywh_to_xyxy(target_boxes[i].float().reshape(-1, 4))
    top_left = torch.maximum(pred[:, :, None, :2], gt[:, None, :, :2])
    bottom_right = torch.minimum(pred[:, :, None, 2:], gt[:, None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    areas = [(b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1]) for b in (pred, gt)]
    union = areas[0][:, :, None] + areas[1][:, None, :] - inter
    iou = (inter / union.clamp(min=1e-12)).tolist()  # (n, most_pred, most_gt)
    result: dict[str, float] = {}
    for cls in range(num_classes):
        records = []  # (score, image, prediction index)
        objects = [[j for j, c in enumerate(target_classes[i].tolist()) if c == cls]
                   for i in range(n)]
        total = sum(len(o) for o in objects)
        if total == 0:
            continue
        for i in range(n):
            records += [(s, i, r) for r, (s, c) in enumerate(zip(pred_scores[i].tolist(),
                                                                 pred_classes[i].tolist()))
                        if c == cls]
        claimed = [set() for _ in range(n)]
        records.sort(key=lambda r: -r[0])
        hits = []
        for _, i, r in records:
            best, best_iou = -1, iou_threshold
            for j in objects[i]:
                if j not in claimed[i] and iou[i][r][j] >= best_iou:
                    best, best_iou = j, iou[i][r][j]
            if best >= 0:
                claimed[i].add(best)
            hits.append(best >= 0)
        tp = torch.tensor(hits, dtype=torch.float64).cumsum(0)
        precision = tp / torch.arange(1, len(hits) + 1, dtype=torch.float64)
        recall = tp / total
        # precision envelope, then the area under the step curve
        envelope = precision.flip(0).cummax(0).values.flip(0)
        recall_steps = torch.cat([torch.zeros(1, dtype=torch.float64), recall]).diff()
        result[f"ap_{CLASS_NAMES[cls] if num_classes == len(CLASS_NAMES) else cls}"] = float(
            (recall_steps * envelope).sum()) if len(hits) else 0.0
    result["ap"] = float(sum(result.values()) / len(result)) if result else 0.0
    return result


def _check_detections(boxes: Tensor, scores: Tensor, classes: Tensor) -> None:
    _check_boxes("pred_boxes", boxes)
    if boxes.dim() != 2 or scores.shape != boxes.shape[:1] or classes.shape != boxes.shape[:1]:
        raise ValueError(f"pred_boxes (d, 4), pred_scores (d,) and pred_classes (d,) must agree, "
                         f"got {tuple(boxes.shape)}, {tuple(scores.shape)}, {tuple(classes.shape)}")


def _check_image_targets(target_boxes: Tensor, target_classes: Tensor) -> Tensor:
    """One image's targets checked: its boxes as (k, 4), target_classes (k,)."""
    target_boxes = _check_boxes("target_boxes", target_boxes).reshape(-1, 4)
    if target_classes.shape != target_boxes.shape[:1]:
        raise ValueError(f"target_classes must be ({len(target_boxes)},), "
                         f"got {tuple(target_classes.shape)}")
    return target_boxes


def duplicated_objects(pred_boxes: Tensor, pred_scores: Tensor, pred_classes: Tensor,
                       target_boxes: Tensor, target_classes: Tensor, *,
                       score_threshold: float = 0.5, iou_threshold: float = 0.5) -> Tensor:
    """Which true objects of one image a detector answers more than once.

    pred_boxes (d, 4) cxcywh, pred_scores (d,), pred_classes (d,); target_boxes (k, 4) cxcywh,
    target_classes (k,). Returns (k,) bool: True where at least two predictions with score
    > ``score_threshold`` and the object's class overlap the object with IoU >= ``iou_threshold``
    (two confident answers for one object, of which AP counts one as a false positive)."""
    _check_detections(pred_boxes, pred_scores, pred_classes)
    target_boxes = _check_image_targets(target_boxes, target_classes)
    keep = pred_scores > score_threshold
    if not keep.any() or len(target_boxes) == 0:
        return torch.zeros(len(target_boxes), dtype=torch.bool)
    iou, _ = box_iou(box_cxcywh_to_xyxy(pred_boxes[keep].float()),
                     box_cxcywh_to_xyxy(target_boxes.float()))  # (d', k)
    same = pred_classes[keep][:, None] == target_classes[None, :]
    return ((iou >= iou_threshold) & same).sum(0) >= 2


def found_objects(pred_boxes: Tensor, pred_scores: Tensor, pred_classes: Tensor,
                  target_boxes: Tensor, target_classes: Tensor, *,
                  iou_threshold: float = 0.5) -> Tensor:
    """Which true objects of one image a detector finds when it may keep only as many
    detections as the image has objects (its k best by score, ties to the lower index): an
    object is found when one of those, of its class, overlaps it with IoU >= ``iou_threshold``.
    The same number of guesses for every detector, whatever its score scale.

    Shapes as in :func:`duplicated_objects`. Returns (k,) bool."""
    _check_detections(pred_boxes, pred_scores, pred_classes)
    target_boxes = _check_image_targets(target_boxes, target_classes)
    best = torch.sort(pred_scores, descending=True, stable=True).indices[:len(target_boxes)]
    if len(best) == 0:
        return torch.zeros(len(target_boxes), dtype=torch.bool)
    iou, _ = box_iou(box_cxcywh_to_xyxy(target_boxes.float()),
                     box_cxcywh_to_xyxy(pred_boxes[best].float()))  # (k, k')
    same = target_classes[:, None] == pred_classes[best][None, :]
    return ((iou >= iou_threshold) & same).any(1)


def crowded_objects(target_boxes: Tensor) -> Tensor:
    """Which objects of one image have a box that overlaps (shares area with) another
    object's box: the touching, covering and covered ones. target_boxes (k, 4) cxcywh.
    Returns (k,) bool."""
    xyxy = box_cxcywh_to_xyxy(_check_boxes("target_boxes", target_boxes).reshape(-1, 4))
    iou, _ = box_iou(xyxy, xyxy)
    return (iou.fill_diagonal_(0) > 0).any(1)


def nms(pred_boxes: Tensor, pred_scores: Tensor, pred_classes: Tensor,
        iou_threshold: float = 0.5) -> Tensor:
    """Greedy per-class non-maximum suppression, the step DETR's set loss is meant to make
    unnecessary: in descending score, keep a box unless a kept box of its class overlaps it
    with IoU > ``iou_threshold``.

    pred_boxes (d, 4) cxcywh, pred_scores (d,), pred_classes (d,). Returns the kept indices
    (int64), highest score first (ties keep the lower index first)."""
    _check_detections(pred_boxes, pred_scores, pred_classes)
    order = torch.sort(pred_scores, descending=True, stable=True).indices
    iou, _ = box_iou(*(2 * (box_cxcywh_to_xyxy(pred_boxes.float()),)))
    suppressed = torch.zeros(len(pred_boxes), dtype=torch.bool)
    kept = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        kept.append(i)
        suppressed |= (iou[i] > iou_threshold) & (pred_classes == pred_classes[i])
    return torch.tensor(kept, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# 6. The DETR trained on the shapes
# --------------------------------------------------------------------------------------------

def set_loss(output: DETROutput, target_classes: list[Tensor], target_boxes: list[Tensor],
             eos_coef: float = 0.1) -> Tensor:
    """DETR's training loss: :func:`detr_loss` on the last decoder layer's predictions plus,
    each matched on its own, on every earlier layer's (auxiliary losses)."""
    total = output.logits.new_zeros(())
    for logits, boxes in [*output.aux, (output.logits, output.boxes)]:
        total = total + detr_loss(logits, boxes, target_classes, target_boxes,
                                  eos_coef=eos_coef)["loss"]
    return total


@torch.no_grad()
def detection_ap(model: DETR, images: Tensor, target_boxes: list[Tensor],
                 target_classes: list[Tensor], iou_threshold: float = 0.5,
                 batch_size: int = 256) -> dict[str, float]:
    """Box AP at ``iou_threshold`` of every query's detection on held-out images (see
    :func:`average_precision`); the model is put in eval mode. The images go to the model's
    device in batches, the detections come back to the CPU, beside the targets."""
    model.eval()
    device = next(model.parameters()).device
    parts = [[t.cpu() for t in model.predict(images[i:i + batch_size].to(device))]
             for i in range(0, len(images), batch_size)]
    boxes, scores, classes = (torch.cat(p) for p in zip(*parts))
    return average_precision(list(boxes), list(scores), list(classes), target_boxes,
                             target_classes, model.config.num_classes, iou_threshold)


def shapes_detr_info() -> dict[str, Any]:
    """The JSON stored beside the shipped DETR's weights: ``config`` (DETRConfig fields),
    ``scenes`` (its task, a key of :data:`SCENES`), the training settings and data seeds,
    ``seconds``, the validation ``curve`` (step, loss, AP50, seconds, then AP75 where
    recorded) and ``heldout_ap50``."""
    return shipped_info(CHECKPOINT)


def load_shapes_detr(device: torch.device | str | None = None) -> Shipped:
    """The DETR trained longer on :func:`cluttered_shapes` by ``scripts/train_detr.py``
    (float32, eval mode, on ``device``; default CPU), with no tokenizer (``None``): it reads
    pixels. Its recorded figures are in :func:`shapes_detr_info`."""
    model = DETR(DETRConfig(**shapes_detr_info()["config"]))
    model.load_state_dict(shipped_state(CHECKPOINT))
    return Shipped(model.to(device or "cpu").eval(), None)
