"""Attention cost: naive (materialised weights) vs flash_attention vs torch SDPA, measured in one run.

CPU (always): time and peak memory for n up to 8192, float32, one (batch, head) of d = 64, full and
causal. Checks the targets: at n = 8192, flash_attention uses at most 1/8 of the naive peak memory
and at most 2x its time.
GPU (only with CUDA): the Triton kernel vs torch SDPA in TFLOP/s (4 b h n^2 d FLOPs, half of that
for causal), bfloat16, d in {64, 128}, n from 1k to 16k, causal and not; target: the kernel
reaches at least SDPA's throughput.

Run: .venv/bin/python benchmarks/attention.py [--quick]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lecture_pkg import kernels
from lecture_pkg.attention import flash_attention, scaled_dot_product_attention
from lecture_pkg.measure import peak_memory, wall_time

MIB = 2**20


def cpu_implementations(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        is_causal: bool) -> dict[str, Callable[[], object]]:
    return {
        "naive": lambda: scaled_dot_product_attention(q, k, v, is_causal=is_causal),
        "flash": lambda: flash_attention(q, k, v, is_causal=is_causal, backend="torch"),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
    }


def interleaved_median_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per function over ``repeats`` rounds, each round timing every function once
    (with ``wall_time``), so that load from other processes on a shared machine hits all of them
    alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(wall_time(fn, repeats=1, warmup=0))
    return {name: statistics.median(ts) for name, ts in times.items()}


def cpu_table(sizes: list[int], head_dim: int, repeats: int) -> dict[tuple[int, bool], dict]:
    print(f"\n## CPU: float32, (batch, heads) = (1, 1), d = {head_dim}, "
          f"{torch.get_num_threads()} threads, median of {repeats} interleaved runs")
    print("| n | mask | naive s | flash s | sdpa s | flash/naive time | sdpa/naive time "
          "| naive MiB | flash MiB | sdpa MiB | flash/naive memory |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, 1, n, head_dim, generator=gen) for _ in range(3))
        for is_causal in (False, True):
            fns = cpu_implementations(q, k, v, is_causal)
            with torch.no_grad():
                for fn in fns.values():  # warm-up: first-call costs are not the algorithm's
                    fn()
                memory = {name: peak_memory(fn)[1] / MIB for name, fn in fns.items()}
                seconds = interleaved_median_times(fns, repeats)
            results[(n, is_causal)] = {"time": seconds, "memory": memory}
            print(f"| {n} | {'causal' if is_causal else 'full'} | {seconds['naive']:.3f} "
                  f"| {seconds['flash']:.3f} | {seconds['sdpa']:.3f} "
                  f"| {seconds['flash'] / seconds['naive']:.2f} | {seconds['sdpa'] / seconds['naive']:.2f} "
                  f"| {memory['naive']:.1f} | {memory['flash']:.1f} | {memory['sdpa']:.1f} "
                  f"| {memory['flash'] / memory['naive']:.3f} |")
    return results


def check_cpu_targets(results: dict[tuple[int, bool], dict], n: int) -> None:
    print(f"\nCPU targets (stated for n = 8192) at n = {n}: flash memory <= 1/8 naive, "
          f"flash time <= 2x naive")
    for is_causal in (False, True):
        row = results[(n, is_causal)]
        memory = row["memory"]["flash"] / row["memory"]["naive"]
        seconds = row["time"]["flash"] / row["time"]["naive"]
        verdict = "met" if memory <= 1 / 8 and seconds <= 2 else "NOT met"
        print(f"- {'causal' if is_causal else 'full'}: memory ratio {memory:.3f} (1/8 = 0.125), "
              f"time ratio {seconds:.2f}: {verdict}")


def gpu_table(sizes: list[int], tokens: int) -> None:
    device = torch.device("cuda")
    print(f"\n## GPU: {torch.cuda.get_device_name(device)}, bfloat16, batch * n = {tokens} tokens, "
          f"16 heads (d = 64: 32 heads), TFLOP/s = 4 b h n^2 d (causal: half) / median time")
    print("| d | n | mask | batch x heads | triton TFLOP/s | sdpa TFLOP/s | triton/sdpa | "
          "triton MiB | sdpa MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for head_dim in (64, 128):
        heads = 32 if head_dim == 64 else 16
        for n in sizes:
            batch = max(1, tokens // n)
            q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=torch.bfloat16)
                       for _ in range(3))
            for is_causal in (False, True):
                flops = 4 * batch * heads * n * n * head_dim / (2 if is_causal else 1)
                fns = {"triton": lambda: flash_attention(q, k, v, is_causal=is_causal,
                                                         backend="triton"),
                       "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)}
                tflops = {name: flops / wall_time(fn, device, repeats=10, warmup=3,
                                                   statistic="median") / 1e12
                          for name, fn in fns.items()}
                memory = {name: peak_memory(fn, device)[1] / MIB for name, fn in fns.items()}
                print(f"| {head_dim} | {n} | {'causal' if is_causal else 'full'} | {batch} x {heads} "
                      f"| {tflops['triton']:.0f} | {tflops['sdpa']:.0f} "
                      f"| {tflops['triton'] / tflops['sdpa']:.2f} | {memory['triton']:.0f} "
                      f"| {memory['sdpa']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 2048 only (a smoke run)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice). On a shared, "
                             "oversubscribed machine 1 thread gives steadier ratios: a stalled "
                             "OpenMP thread delays every op, which penalises the implementation "
                             "with more, smaller ops")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cpu_sizes = [512, 1024, 2048] if args.quick else [1024, 2048, 4096, 8192]
    print(f"# attention benchmark: torch {torch.__version__}, {platform.processor() or platform.machine()}")
    results = cpu_table(cpu_sizes, head_dim=64, repeats=3 if args.quick else 5)
    check_cpu_targets(results, cpu_sizes[-1])
    if not torch.cuda.is_available():
        print("\nGPU part not run: no CUDA device here.")
        return
    if not kernels.triton_usable(torch.device("cuda")):
        print("\nGPU part not run: Triton is not importable.")
        return
    gpu_table([1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384], tokens=16384)


if __name__ == "__main__":
    main()
