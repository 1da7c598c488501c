"""Threads and a busy neighbour: 100 training steps of a small Transformer, idle and beside one
busy process, with 1 and 2 torch threads and OpenMP's default and PASSIVE wait policies.

A chapter's operations are small (a few hundred thousand multiply-adds each), so a second thread
gains little, while two threads that wait for each other at every operation lose the CPU to any
other process on a 2-core machine. ``lecture_pkg.setup_notebook`` therefore uses one thread
(``LECTURE_THREADS`` overrides). Each configuration runs in a fresh process (OpenMP reads
``OMP_WAIT_POLICY`` when it starts); the busy neighbour is one process spinning on one core (a
browser, another notebook), running until the measurement ends. Wall times, the ratio contended /
idle, and the CPU time the training used beside the neighbour (threads spinning at barriers burn
CPU without progress). On a machine shared with other work "idle" is only as idle as the machine.

Run: .venv/bin/python benchmarks/threads.py [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

TRAIN = """
import sys, time, torch
from lecture_pkg.layers import EncoderLayer
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
layers = torch.nn.ModuleList(EncoderLayer(64, 4, 256, dropout=0.0) for _ in range(2))
opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
x = torch.randn(16, 32, 64)
steps = int(sys.argv[2])
start = time.perf_counter()
for step in range(steps if steps > 0 else 10**9):
    h = x
    for layer in layers:
        h = layer(h)[0]
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(time.perf_counter() - start)
"""


def run(threads: int, steps: int, policy: str | None) -> tuple[float, float]:
    """(wall seconds of the steps, CPU seconds of the whole child process)."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", TRAIN, str(threads), str(steps)], env=env,
                         capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(out.stdout.strip().splitlines()[-1]), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    configs = [(2, None), (2, "PASSIVE"), (1, None), (1, "PASSIVE")]
    print(f"{args.steps} steps, 2-layer encoder d=64, batch 16 x 32; os.cpu_count() = {os.cpu_count()}")
    print(f"{'threads':>7} {'OMP_WAIT_POLICY':>15} {'idle s':>8} {'busy s':>8} {'ratio':>6} {'busy CPU s':>10}")
    for threads, policy in configs:
        idle, _ = run(threads, args.steps, policy)
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            busy, cpu = run(threads, args.steps, policy)
        finally:
            neighbour.kill()
            neighbour.wait()
        print(f"{threads:>7} {policy or 'default':>15} {idle:>8.2f} {busy:>8.2f} {busy / idle:>6.1f} {cpu:>10.2f}")


if __name__ == "__main__":
    main()
