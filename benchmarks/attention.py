"""Attention cost: naive (materialised weights) vs flash_attention vs torch SDPA, measured in one run.

CPU (always): time and peak memory for n up to 8192, float32, one (batch, head) of d = 64, full and
causal. Checks the targets: at n = 8192, flash_attention uses at most 1/8 of the naive peak memory
and at most 2x its time.
GPU (only with CUDA): the Triton FlashAttention-2 kernels vs torch SDPA (its default kernel and its
flash backend) in TFLOP/s (4 b h n^2 d FLOPs for the forward, 2.5x that with the backward, half of
that for causal), fp16 and bf16, d in {64, 128}, n from 1k to 16k at batch * n = 16k tokens and
heads * d = 2048, causal and not; every shape's output and gradients checked against float64
(triton's error within 2x SDPA's in the same dtype). Targets: forward >= 1.0x SDPA, and >= 450
TFLOP/s at d = 128, n >= 4k on an H100.

Run: .venv/bin/python benchmarks/attention.py [--quick] [--gpu-only] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Callable
from pathlib import Path

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


GPU_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ERROR_FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3}  # as in tests/test_attention_triton.py


def attention_flops(batch: int, heads: int, n: int, head_dim: int, is_causal: bool,
                    backward: bool) -> float:
    """4 b h n^2 d for the forward's two matrix products (2.5x that with the backward's five),
    halved for causal attention."""
    forward = 4 * batch * heads * n * n * head_dim / (2 if is_causal else 1)
    return forward * (2.5 if backward else 1.0)


def gpu_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
               is_causal: bool) -> dict[str, dict[str, float]]:
    """Max absolute error of the output and of dq, dk, dv against float64, for the Triton kernels
    and for torch's SDPA in the same dtype, on the first two heads of the first batch element
    (float64 attention over all heads of a 16k sequence would dominate the run)."""
    q, k, v, grad_out = (x[:1, :2].detach() for x in (q, k, v, grad_out))

    def run(attend, dtype: torch.dtype) -> list[torch.Tensor]:
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        out = attend(*leaves)
        out.backward(grad_out.to(dtype))
        return [out.detach()] + [x.grad for x in leaves]

    exact = run(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal), torch.float64)
    triton = run(lambda *x: flash_attention(*x, is_causal=is_causal, backend="triton"), q.dtype)
    sdpa = run(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal), q.dtype)
    names = ("out", "dq", "dk", "dv")
    return {impl: {name: (got.double() - want).abs().max().item()
                   for name, got, want in zip(names, grads, exact)}
            for impl, grads in (("triton", triton), ("sdpa", sdpa))}


def gpu_table(sizes: list[int], tokens: int, hidden: int, dtypes: list[str],
              head_dims: list[int]) -> list[dict]:
    """Triton FlashAttention-2 against torch SDPA (its default choice of kernel, and its flash
    backend forced), forward and forward + backward, fp16 and bf16, d = 64 and 128, causal and
    not, n in ``sizes`` at batch * n = ``tokens`` and heads * d = ``hidden``. Times are
    triton.testing.do_bench medians (it flushes the L2 cache between runs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    device = torch.device("cuda")
    rows = []
    print(f"\n## GPU: {torch.cuda.get_device_name(device)}, batch * n = {tokens} tokens, "
          f"heads * d = {hidden}; TFLOP/s = 4 b h n^2 d (x2.5 with the backward, causal: half) "
          f"/ median time; errors: max |x - float64| on 2 heads, triton / sdpa")
    print("| dtype | d | n | mask | pass | triton TFLOP/s | sdpa TFLOP/s | sdpa-flash TFLOP/s "
          "| triton/sdpa | error out | error dq | error dk | error dv |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dtype_name in dtypes:
        dtype = GPU_DTYPES[dtype_name]
        for head_dim in head_dims:
            heads = hidden // head_dim
            for n in sizes:
                batch = max(1, tokens // n)
                gen = torch.Generator(device).manual_seed(n + head_dim)
                q, k, v, grad_out = (torch.randn(batch, heads, n, head_dim, device=device,
                                                 dtype=dtype, generator=gen) for _ in range(4))
                for is_causal in (False, True):
                    errors = gpu_errors(q, k, v, grad_out, is_causal)
                    accurate = all(errors["triton"][name] <= 2 * errors["sdpa"][name]
                                   + ERROR_FLOOR[dtype] for name in errors["triton"])
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

                    def triton_fwd(x=leaves):
                        return flash_attention(*x, is_causal=is_causal, backend="triton")

                    def sdpa_fwd(x=leaves):
                        return F.scaled_dot_product_attention(*x, is_causal=is_causal)

                    def sdpa_flash_fwd(x=leaves):
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return sdpa_fwd(x)

                    fns = {"triton": triton_fwd, "sdpa": sdpa_fwd, "sdpa-flash": sdpa_flash_fwd}
                    for backward in (False, True):
                        flops = attention_flops(batch, heads, n, head_dim, is_causal, backward)
                        tflops = {}
                        for name, fn in fns.items():
                            def step(fn=fn):
                                if backward:
                                    fn().backward(grad_out)
                                else:
                                    with torch.no_grad():
                                        fn()
                            ms = do_bench(step, warmup=25, rep=100, grad_to_none=leaves,
                                          return_mode="median")
                            tflops[name] = flops / (ms * 1e-3) / 1e12
                        ratio = tflops["triton"] / tflops["sdpa"]
                        row = {"dtype": dtype_name, "head_dim": head_dim, "n": n, "batch": batch,
                               "heads": heads, "causal": is_causal,
                               "pass": "fwd+bwd" if backward else "fwd", "tflops": tflops,
                               "triton_over_sdpa": ratio, "errors": errors, "accurate": accurate}
                        rows.append(row)
                        e = errors
                        print(f"| {dtype_name} | {head_dim} | {n} | {'causal' if is_causal else 'full'} "
                              f"| {row['pass']} | {tflops['triton']:.0f} | {tflops['sdpa']:.0f} "
                              f"| {tflops['sdpa-flash']:.0f} | {ratio:.2f} "
                              + " | ".join(f"{e['triton'][m]:.1e} / {e['sdpa'][m]:.1e}"
                                           for m in ("out", "dq", "dk", "dv"))
                              + (" |" if accurate else " | INACCURATE"), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 2048 only (a smoke run)")
    parser.add_argument("--gpu-only", action="store_true", help="skip the CPU tables")
    parser.add_argument("--json", type=Path, default=None, help="also write the GPU rows here")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(GPU_DTYPES),
                        default=list(GPU_DTYPES), help="GPU dtypes (default: %(default)s)")
    parser.add_argument("--head-dims", nargs="+", type=int, choices=(64, 128),
                        default=[64, 128], help="GPU head dims (default: %(default)s)")
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
    if not args.gpu_only:
        results = cpu_table(cpu_sizes, head_dim=64, repeats=3 if args.quick else 5)
        check_cpu_targets(results, cpu_sizes[-1])
    if not torch.cuda.is_available():
        print("\nGPU part not run: no CUDA device here.")
        return
    if not kernels.triton_usable(torch.device("cuda")):
        print("\nGPU part not run: Triton is not importable.")
        return
    import triton

    rows = gpu_table([1024, 2048] if args.quick else [1024, 2048, 4096, 8192, 16384],
                     tokens=16384, hidden=2048, dtypes=args.dtypes, head_dims=args.head_dims)
    if args.json is not None:
        versions = {"torch": torch.__version__, "triton": triton.__version__,
                    "cuda": torch.version.cuda, "device": torch.cuda.get_device_name()}
        args.json.write_text(json.dumps({"versions": versions, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
