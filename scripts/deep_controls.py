"""Chapter 6.1's control arms at 18 + 18 layers, recorded: post-LN with a 40-step linear
warmup to 2e-3, post-LN at a four times lower rate (5e-4, no warmup), and the sandwich wiring
at the page's 2e-3 without warmup; 120 steps, batches of 16, seeds(3) (the page's
:func:`lecture_pkg.deep_wirings.train_deep`, on CPU at one thread). The page trains post-LN,
pre-LN and DeepNorm live at the same settings and reads these from
``lecture_pkg/recorded/deep_controls_cpu.json`` (``make deep-controls``; a few minutes).

    OMP_NUM_THREADS=1 python scripts/deep_controls.py --out lecture_pkg/recorded/deep_controls_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

import torch

from lecture_pkg import seed_offset, seeds
from lecture_pkg.deep_wirings import train_deep
from lecture_pkg.number_translation import NumberTranslation

ARMS = {  # name: (wiring, rate, warmup steps)
    "post-LN, warmup 40": ("post", 2e-3, 40),
    "post-LN, lr 5e-4": ("post", 5e-4, 0),
    "sandwich": ("sandwich", 2e-3, 0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = NumberTranslation()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"command": "OMP_NUM_THREADS=1 python scripts/deep_controls.py --out "
                       + args.out, "commit": commit, "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "seed_offset": seed_offset(),
            "steps": 120, "depth": 18, "batch": 16}
    runs, start = [], time.time()
    for arm, (wiring, lr, warmup) in ARMS.items():
        for seed in seeds(args.seeds):
            run = train_deep(task, wiring, seed, lr=lr, warmup=warmup)
            runs.append({"arm": arm, "wiring": wiring, "lr": lr, "warmup": warmup,
                         "seed": seed, "end_loss": run.end_loss,
                         "exact_match": run.exact_match,
                         "losses": [round(v, 4) for v in run.losses]})
            print({k: v for k, v in runs[-1].items() if k != "losses"}, flush=True)
    info["seconds"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump({"info": info, "runs": runs}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
