"""Train the small DETR of chapter 8.3 on synthetic scenes and save it as a checkpoint.

    OMP_NUM_THREADS=1 python scripts/train_detr.py

(the defaults are the shipped run's: cluttered scenes, 40,000 steps, 48,000 training scenes).

Writes lecture_pkg/checkpoints/detr_shapes.safetensors and detr_shapes.json (config, scene
kind, steps, seconds, the validation curve, held-out AP@0.5 with the data seeds). Training
images come from generator seed 0, held-out images from seed 1 (whole images never seen in
training), and the curve printed during training from a validation set of seed 3, so the
held-out images decide nothing. ``--scenes shapes`` is the uncluttered task
(:func:`~lecture_pkg.detection.synthetic_shapes`), ``cluttered`` the harder one
(:func:`~lecture_pkg.detection.cluttered_shapes`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from lecture_pkg import seed_everything
from lecture_pkg.detection import SCENES, detection_ap, set_loss
from lecture_pkg.models.detr import DETR, DETRConfig
from lecture_pkg.shipped import save_shipped
from lecture_pkg.training import adamw, warmup_cosine

OUT = Path(__file__).resolve().parent.parent / "lecture_pkg" / "checkpoints"
TRAIN_SEED, TEST_SEED, VAL_SEED, TEST_N, VAL_N = 0, 1, 3, 1000, 300


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40000)
    parser.add_argument("--train-n", type=int, default=48000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--name", default="detr_shapes")
    parser.add_argument("--scenes", choices=sorted(SCENES), default="cluttered")
    parser.add_argument("--backbone-width", type=int, default=DETRConfig.backbone_width)
    parser.add_argument("--backbone-stages", type=int, default=DETRConfig.backbone_stages)
    parser.add_argument("--eval-every", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seed_everything(0)
    began = time.perf_counter()
    make = SCENES[args.scenes]
    train = make(args.train_n, generator=torch.Generator().manual_seed(TRAIN_SEED))
    val = make(VAL_N, generator=torch.Generator().manual_seed(VAL_SEED))
    test = make(TEST_N, generator=torch.Generator().manual_seed(TEST_SEED))
    curve = []
    config = DETRConfig(backbone_width=args.backbone_width,
                        backbone_stages=args.backbone_stages)
    model = DETR(config)
    optimizer = adamw(model, lr=args.lr, weight_decay=1e-4, betas=(0.9, 0.999))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(200, args.steps, min_ratio=0.05))
    order = torch.Generator().manual_seed(2)
    model.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, args.train_n, (args.batch,), generator=order).tolist()
        out = model(train.images[idx])
        loss = set_loss(out, [train.classes[i] for i in idx], [train.boxes[i] for i in idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            ap, ap75 = (detection_ap(model, val.images, val.boxes, val.classes, iou)["ap"]
                        for iou in (0.5, 0.75))
            model.train()
            elapsed = time.perf_counter() - began
            curve.append([step, round(loss.item(), 4), round(ap, 4), round(elapsed),
                          round(ap75, 4)])
            print(f"step {step} loss {loss.item():.3f} val AP50 {ap:.3f} AP75 {ap75:.3f} "
                  f"{elapsed:.0f} s", flush=True)
    seconds = time.perf_counter() - began
    ap = detection_ap(model, test.images, test.boxes, test.classes)
    print("held-out", ap)
    meta = {"config": dataclasses.asdict(config), "scenes": args.scenes, "steps": args.steps, "batch": args.batch,
            "lr": args.lr, "train_n": args.train_n, "train_seed": TRAIN_SEED,
            "test_seed": TEST_SEED, "test_n": TEST_N, "val_seed": VAL_SEED,
            "val_n": VAL_N, "seconds": round(seconds), "threads": 1,
            "curve": curve, "heldout_ap50": ap["ap"]}
    save_shipped(OUT, args.name, model.state_dict(), meta)


if __name__ == "__main__":
    main()
