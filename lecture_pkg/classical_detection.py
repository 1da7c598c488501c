"""Detectors that learn nothing, the baselines a trained detector on chapter 8.3's scenes must
beat (:func:`lecture_pkg.detection.cluttered_shapes`):

1. :func:`threshold_detector`: a foreground map (:func:`foreground`: the brightest channel, or
   each pixel's colour distance from the mean colour around it), a threshold, 8-connected
   components (:func:`connected_components`) and a class rule on each component's fill ratio
   (a square fills its bounding square, a circle pi/4 of it, a triangle half);
2. :func:`template_detector`: a sliding window: every shape at every size as a template, its
   match with each window scored by normalised cross-correlation (:func:`template_scores`),
   then non-maximum suppression, as detectors worked before learned features;
3. :func:`tune_threshold_detector`, :func:`tune_template_detector`: their settings chosen by
   AP on validation scenes, never on the held-out ones.

Detections come back as DETR's do, one entry per image: boxes (d, 4) normalised cxcywh, scores
(d,), classes (d,), ready for :func:`lecture_pkg.detection.average_precision`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lecture_pkg.checks import check_int
from lecture_pkg.detection import (
    CLASS_NAMES,
    _shape_mask,
    average_precision,
    box_cxcywh_to_xyxy,
    box_iou,
)

__all__ = [
    "Detections",
    "connected_components",
    "foreground",
    "template_detector",
    "template_scores",
    "threshold_detector",
    "tune_template_detector",
    "tune_threshold_detector",
]

Feature = Literal["brightness", "contrast"]


class Detections(NamedTuple):
    """Per image i: boxes[i] (d_i, 4) normalised cxcywh, scores[i] (d_i,), classes[i] (d_i,)."""

    boxes: list[Tensor]
    scores: list[Tensor]
    classes: list[Tensor]


def _check_images(images: Tensor) -> Tensor:
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"images must be a float tensor (n, channels, h, w), got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"images must be square, got {tuple(images.shape[-2:])}")
    return images.float().cpu()


# --------------------------------------------------------------------------------------------
# 1. Threshold, components, fill ratio
# --------------------------------------------------------------------------------------------

def foreground(images: Tensor, feature: Feature = "brightness", window: int = 11) -> Tensor:
    """(n, c, h, w) -> (n, h, w): what sets a pixel apart from the background.

    ``brightness``: the largest channel. ``contrast``: the Euclidean distance of the pixel's
    colour from the mean colour of the ``window`` x ``window`` square around it (edges
    replicated), which follows a slowly varying background."""
    images = _check_images(images)
    if feature == "brightness":
        return images.amax(1)
    if feature != "contrast":
        raise ValueError(f"feature must be 'brightness' or 'contrast', got {feature!r}")
    check_int("window", window, minimum=3)
    if window % 2 == 0:
        raise ValueError(f"window must be odd, got {window}")
    padded = F.pad(images, (window // 2,) * 4, mode="replicate")
    local = F.avg_pool2d(padded, window, stride=1)
    return (images - local).square().sum(1).sqrt()


def connected_components(mask: Tensor) -> Tensor:
    """8-connected components of (n, h, w) bool masks -> (n, h, w) int64 labels: 0 off the
    mask, and on it one positive label per component (the largest flat index + 1 of its
    pixels; labels are not consecutive). Label propagation: every pixel takes the largest
    label among its 3 x 3 neighbours on the mask until nothing changes."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 3:
        raise ValueError(f"mask must be a bool tensor (n, h, w), got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} "
                         f"{tuple(getattr(mask, 'shape', ()))}")
    n, h, w = mask.shape
    if h * w >= 2 ** 24:
        raise ValueError(f"mask has {h * w} pixels per image; float32 labels need < 2**24")
    index = torch.arange(1, h * w + 1, dtype=torch.float32).reshape(1, h, w)
    labels = torch.where(mask, index, torch.zeros(()))
    while True:
        grown = F.max_pool2d(labels[:, None], 3, stride=1, padding=1)[:, 0] * mask
        if torch.equal(grown, labels):
            return labels.long()
        labels = grown


def _component_stats(labels: Tensor) -> list[Tensor]:
    """Per image, (k, 5) float: x0, y0, x1, y1 (inclusive pixel bounds) and area of each
    component."""
    n, h, w = labels.shape
    ys = torch.arange(h).reshape(1, h, 1).expand(n, h, w)
    xs = torch.arange(w).reshape(1, 1, w).expand(n, h, w)
    out = []
    for i in range(n):
        on = labels[i] > 0
        ids, inverse = torch.unique(labels[i][on], return_inverse=True)
        k = len(ids)
        y, x = ys[i][on], xs[i][on]
        big = torch.full((k,), h + w, dtype=torch.long)
        stats = torch.stack([
            big.scatter_reduce(0, inverse, x, "amin"), big.scatter_reduce(0, inverse, y, "amin"),
            (-big).scatter_reduce(0, inverse, x, "amax"),
            (-big).scatter_reduce(0, inverse, y, "amax"),
            torch.bincount(inverse, minlength=k)], dim=1).float()
        out.append(stats.reshape(-1, 5))
    return out


def _classify_components(stats: list[Tensor], size: int, min_area: int, square_fill: float,
                         circle_fill: float) -> Detections:
    boxes, scores, classes = [], [], []
    for s in stats:
        x0, y0, x1, y1, area = s.unbind(1)
        h, w = y1 - y0 + 1, x1 - x0 + 1
        side = torch.maximum(h, w)
        fill = area / side**2
        keep = area >= min_area
        cls = torch.where(fill > square_fill, 0, torch.where(fill > circle_fill, 1, 2))
        # a square of the larger side, centred across and standing on the component's bottom
        cx, bottom = (x0 + x1 + 1) / 2, y1 + 1
        box = torch.stack([cx, bottom - side / 2, side, side], dim=1) / size
        boxes.append(box[keep])
        scores.append((torch.minimum(h, w) / side)[keep])  # squareness: strokes score low
        classes.append(cls[keep].long())
    return Detections(boxes, scores, classes)


def threshold_detector(images: Tensor, threshold: float = 0.4, *,
                       feature: Feature = "brightness", window: int = 11, min_area: int = 9,
                       square_fill: float = 0.9, circle_fill: float = 0.64) -> Detections:
    """Detect with no learning: pixels whose :func:`foreground` value exceeds ``threshold``,
    grouped into 8-connected components (:func:`connected_components`); a component of at
    least ``min_area`` pixels becomes one detection. Its box is the square of its larger side,
    centred across it and standing on its bottom row; its class is square when its pixels fill
    more than ``square_fill`` of that square, circle above ``circle_fill``, else triangle; its
    score is min(h, w) / max(h, w) of its extent (thin strokes score low).

    images: (n, c, size, size) in [0, 1]. Returns :class:`Detections`."""
    images = _check_images(images)
    check_int("min_area", min_area, minimum=1)
    if not 0 <= circle_fill <= square_fill <= 1:
        raise ValueError(f"need 0 <= circle_fill <= square_fill <= 1, got circle_fill="
                         f"{circle_fill}, square_fill={square_fill}")
    mask = foreground(images, feature, window) > threshold
    stats = _component_stats(connected_components(mask))
    return _classify_components(stats, images.shape[-1], min_area, square_fill, circle_fill)


def _coco_ap(det: Detections, target_boxes: list[Tensor], target_classes: list[Tensor],
             thresholds: Iterable[float]) -> float:
    aps = [average_precision(det.boxes, det.scores, det.classes, target_boxes, target_classes,
                             len(CLASS_NAMES), t)["ap"] for t in thresholds]
    return sum(aps) / len(aps)


def tune_threshold_detector(images: Tensor, target_boxes: list[Tensor],
                            target_classes: list[Tensor], *,
                            thresholds: dict[str, Sequence[float]] | None = None,
                            windows: Sequence[int] = (11,),
                            min_areas: Sequence[int] = (9, 16),
                            fills: Sequence[tuple[float, float]] = ((0.85, 0.6), (0.9, 0.7)),
                            iou_thresholds: Sequence[float] = (0.5, 0.75)) -> dict:
    """Grid search of :func:`threshold_detector`'s settings on validation scenes: every
    feature and its ``thresholds``, ``windows`` (contrast only), ``min_areas`` and
    (square_fill, circle_fill) pairs in ``fills``; the score is AP averaged over
    ``iou_thresholds``. Returns the best settings as keyword arguments, plus ``"val_ap"``."""
    thresholds = thresholds or {"brightness": (0.6, 0.7, 0.8),
                                "contrast": (0.2, 0.3, 0.4)}
    images = _check_images(images)
    best: dict = {"val_ap": -1.0}
    for feature, values in thresholds.items():
        for window in (windows if feature == "contrast" else (11,)):
            fg = foreground(images, feature, window)  # type: ignore[arg-type]
            for threshold in values:
                stats = _component_stats(connected_components(fg > threshold))
                for min_area, (square_fill, circle_fill) in itertools.product(min_areas, fills):
                    det = _classify_components(stats, images.shape[-1], min_area, square_fill,
                                               circle_fill)
                    ap = _coco_ap(det, target_boxes, target_classes, iou_thresholds)
                    if ap > best["val_ap"]:
                        best = {"threshold": threshold, "feature": feature, "window": window,
                                "min_area": min_area, "square_fill": square_fill,
                                "circle_fill": circle_fill, "val_ap": ap}
    return best


# --------------------------------------------------------------------------------------------
# 2. Sliding-window templates
# --------------------------------------------------------------------------------------------

def _templates(size: int) -> Tensor:
    """(classes, size + 2, size + 2): each shape drawn at ``size`` with a one-pixel ring of
    background around it, zero mean and unit norm."""
    t = torch.stack([_shape_mask(k, 1, 1, size, size + 2).float()
                     for k in range(len(CLASS_NAMES))])
    t = t - t.mean((1, 2), keepdim=True)
    return t / t.flatten(1).norm(dim=1)[:, None, None]


def template_scores(images: Tensor, size: int) -> Tensor:
    """How well each shape of side ``size`` explains each window: (n, c, S, S) ->
    (n, classes, S - size + 1, S - size + 1); entry [i, k, y, x] is for shape k in the square
    [x, x + size) x [y, y + size) (plus a one-pixel ring, the image's edge replicated).

    The score is a colour image's normalised cross-correlation with the template t (zero
    mean, unit norm): sqrt(sum_c <x_c, t>^2 / sum_c |x_c - mean(x_c)|^2), the share of the
    window's variance that the shape explains with a free gain per channel (1: the window is
    exactly the shape, of any colour, on a flat background of any colour). In [0, 1]."""
    images = _check_images(images)
    check_int("size", size, minimum=2)
    n, c, s, _ = images.shape
    if size > s:
        raise ValueError(f"size must be at most the image side {s}, got {size}")
    x = F.pad(images, (1, 1, 1, 1), mode="replicate").reshape(n * c, 1, s + 2, s + 2)
    t = _templates(size)[:, None]  # (classes, 1, size + 2, size + 2)
    corr = F.conv2d(x, t).reshape(n, c, len(t), s - size + 1, s - size + 1)
    ones = torch.ones(1, 1, size + 2, size + 2)
    m = (size + 2) ** 2
    sums, squares = F.conv2d(x, ones), F.conv2d(x * x, ones)
    var = (squares - sums**2 / m).clamp(min=0).reshape(n, c, 1, s - size + 1, s - size + 1)
    return (corr.square().sum(1) / var.sum(1).clamp(min=1e-6)).clamp(max=1).sqrt()


def _template_candidates(images: Tensor, sizes: list[int], min_score: float,
                                 candidates: int) -> list[Tensor]:
    """Per image, (d, 5) rows score, class, cx, cy, side (normalised) of the windows that score
    at least ``min_score`` and are local maxima (3 x 3 positions, same shape and side), the
    ``candidates`` best first."""
    n, s = images.shape[0], images.shape[-1]
    parts = []
    for size in sizes:
        score = template_scores(images, size)  # (n, classes, p, p)
        peak = F.max_pool2d(score, 3, stride=1, padding=1) == score
        i, k, y, x = torch.nonzero(peak & (score >= min_score), as_tuple=True)
        value = score[i, k, y, x]
        parts.append(torch.stack([i.float(), value, k.float(), (x + size / 2) / s,
                                  (y + size / 2) / s, torch.full_like(value, size / s)], 1))
    rows = torch.cat(parts)
    rows = rows[torch.argsort(rows[:, 1], descending=True, stable=True)]
    rows = rows[torch.argsort(rows[:, 0], stable=True)]  # by image, best first within each
    counts = torch.bincount(rows[:, 0].long(), minlength=n).tolist()
    return [r[:candidates, 1:] for r in torch.split(rows, counts)]


def _suppress(rows: Tensor, nms_iou: float, max_detections: int) -> tuple[Tensor, Tensor,
                                                                              Tensor]:
    """Greedy class-agnostic NMS on rows sorted best first; returns boxes, scores, classes."""
    box = torch.cat([rows[:, 2:4], rows[:, 4:5], rows[:, 4:5]], dim=1)
    iou, _ = box_iou(*(2 * (box_cxcywh_to_xyxy(box),)))
    over = (iou > nms_iou).numpy()
    suppressed = np.zeros(len(rows), dtype=bool)
    kept: list[int] = []
    for i in range(len(rows)):
        if suppressed[i]:
            continue
        kept.append(i)
        if len(kept) == max_detections:
            break
        suppressed |= over[i]
    index = torch.tensor(kept, dtype=torch.long)
    return box[index], rows[index, 0], rows[index, 1].long()


def template_detector(images: Tensor, sizes: Iterable[int] = range(5, 15), *,
                      min_score: float = 0.5, nms_iou: float = 0.3,
                      max_detections: int = 10, candidates: int = 100) -> Detections:
    """Sliding-window detection: :func:`template_scores` for every shape and every side in
    ``sizes``; a window that scores at least ``min_score`` and is a local maximum (3 x 3
    positions, same shape and side) is a candidate; per image the ``candidates`` best go
    through greedy non-maximum suppression across classes (a box whose IoU with a better kept
    box exceeds ``nms_iou`` is removed), and the ``max_detections`` best survivors are
    returned with their score. images: (n, c, S, S). Returns :class:`Detections`."""
    images = _check_images(images)
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must name at least one template side")
    for name, value in (("max_detections", max_detections), ("candidates", candidates)):
        check_int(name, value, minimum=1)
    if not 0 < nms_iou <= 1:
        raise ValueError(f"nms_iou must be in (0, 1], got {nms_iou}")
    found = [_suppress(r, nms_iou, max_detections)
             for r in _template_candidates(images, sizes, min_score, candidates)]
    return Detections(*(list(x) for x in zip(*found)))


def tune_template_detector(images: Tensor, target_boxes: list[Tensor],
                           target_classes: list[Tensor], *,
                           min_scores: Sequence[float] = (0.4, 0.5, 0.6),
                           nms_ious: Sequence[float] = (0.2, 0.3, 0.4, 0.5),
                           sizes: Iterable[int] = range(5, 15),
                           iou_thresholds: Sequence[float] = (0.5, 0.75)) -> dict:
    """Grid search of :func:`template_detector`'s ``min_score`` and ``nms_iou`` on validation
    scenes by AP averaged over ``iou_thresholds`` (other settings at their defaults). Returns
    the best as keyword arguments, plus ``"val_ap"``."""
    images = _check_images(images)
    best: dict = {"val_ap": -1.0}
    rows = _template_candidates(images, list(sizes), min(min_scores), 100)
    for min_score, nms_iou in itertools.product(min_scores, nms_ious):
        found = [_suppress(r[r[:, 0] >= min_score], nms_iou, 10) for r in rows]
        det = Detections(*(list(x) for x in zip(*found)))
        ap = _coco_ap(det, target_boxes, target_classes, iou_thresholds)
        if ap > best["val_ap"]:
            best = {"min_score": min_score, "nms_iou": nms_iou, "val_ap": ap}
    return best
