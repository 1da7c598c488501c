"""Time a call and measure the peak memory it needs, on the CPU or a CUDA device.

Every chapter's "cost and scale" section and every benchmark measures with these two functions;
:func:`scaling` runs them for several implementations over growing input sizes (a chapter's cost
table), and :class:`Scaling` fits how each cost grows.

Peak memory is what an implementation allocates on top of what existed before the call:

* CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak (exact, per allocation);
* CPU (Linux): the process's resident-set high-water mark (VmHWM), reset through
  ``/proc/self/clear_refs`` just before the call. torch has no CPU allocator statistics, and
  Python's tracemalloc does not see torch's allocations. Large tensors are mmap'ed by the C
  allocator and returned on free, so the high-water mark rises by what the call holds at its
  peak; freed small blocks that the allocator keeps can hide a few MB, which is why free heap
  memory is trimmed first. Numbers are accurate to a few MB, i.e. for tensors well above that.

Two exact counts complement it on any device. :func:`tensor_peak_memory` follows every tensor
storage that an operator creates during a call (a ``TorchDispatchMode`` sees every operator,
backward and optimizer steps included) and reports the most bytes alive at once: what an
allocator without fragmentation or caching would need. :func:`saved_tensor_bytes` counts what
autograd keeps for the backward pass (the activations), through ``saved_tensors_hooks``.
"""

from __future__ import annotations

import ctypes
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Scaling", "peak_memory", "saved_tensor_bytes", "scaling", "tensor_peak_memory",
           "wall_time"]

T = TypeVar("T")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_time(fn: Callable[[], object], device: torch.device | str = "cpu", repeats: int = 5,
              warmup: int = 1, statistic: Literal["min", "median"] = "min",
              cpu_threads: int | None = None) -> float:
    """Wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs (CUDA work is
    waited for, so the time covers the computation, not just the launch). ``"min"`` is the least
    noisy estimate of what the computation itself needs when other processes share the machine;
    ``"median"`` is a typical run. ``cpu_threads`` pins torch's CPU thread count while timing (and
    restores it): on a shared machine, threads waiting for a busy core make timings erratic."""
    device = torch.device(device)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic must be 'min' or 'median', got {statistic!r}")
    if cpu_threads is not None and cpu_threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
    threads = torch.get_num_threads()
    if cpu_threads is not None and device.type == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            _synchronize(device)
            start = time.perf_counter()
            fn()
            _synchronize(device)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return min(times) if statistic == "min" else statistics.median(times)


def _resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def peak_memory(fn: Callable[[], T], device: torch.device | str = "cpu") -> tuple[T, int]:
    """Run ``fn()`` once and return (its result, the bytes it needed at its peak beyond what was
    allocated before). CPU measurement needs Linux (/proc); CUDA uses torch's allocator stats."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        raise RuntimeError(f"peak_memory measures CUDA devices and Linux CPUs, not {device} on "
                           f"{sys.platform}")
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so reuse cannot hide growth
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    before = _resident_kib("VmRSS")
    result = fn()
    return result, (_resident_kib("VmHWM") - before) * 1024


class _LiveStorages(TorchDispatchMode):
    """Bytes of the storages that operators create while the mode is active, alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]
        inputs = {StorageWeakRef(t.untyped_storage()).cdata
                  for t in tree_leaves((args, kwargs)) if _is_real(t)}
        for t in tree_leaves(out):
            if not _is_real(t):
                continue
            storage = t.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata not in inputs and ref.cdata not in self.live:  # new, not a view
                self.live[ref.cdata] = (ref, storage.nbytes())
                self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def _is_real(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "meta" and t.layout == torch.strided


def tensor_peak_memory(fn: Callable[[], T]) -> tuple[T, int]:
    """Run ``fn()`` once and return (its result, the most bytes of tensors created during the
    call that were alive at the same time). Every operator is seen, including the backward pass
    and optimizer steps; in-place results and views of existing tensors add nothing. The count
    is exact and the same on every device and run: an allocator's peak is this plus its
    rounding and cache (``torch.cuda.max_memory_allocated``) or page granularity (RSS)."""
    with _LiveStorages() as tracker:
        result = fn()
    return result, tracker.peak


def saved_tensor_bytes(fn: Callable[[], T], exclude: Iterable[torch.Tensor] = ()
                       ) -> tuple[T, int]:
    """Run ``fn()`` (typically a forward pass) and return (its result, the bytes of the distinct
    tensor storages autograd saved for the backward pass), leaving out the storages of
    ``exclude`` (e.g. the model's parameters and buffers, which exist anyway)."""
    skip = {StorageWeakRef(t.untyped_storage()).cdata for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if _is_real(t):
            storage = t.untyped_storage()
            key = StorageWeakRef(storage).cdata
            if key not in skip:
                saved[key] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(saved.values())


@dataclass
class Scaling:
    """Seconds and peak bytes of named implementations at growing sizes (see :func:`scaling`):
    ``seconds[name][i]`` and ``memory[name][i]`` belong to ``sizes[i]``."""

    sizes: list[int]
    seconds: dict[str, list[float]]
    memory: dict[str, list[int]]

    def exponent(self, name: str, kind: Literal["time", "memory"] = "memory",
                 last: int = 3) -> float:
        """The e of cost ~ size^e: the least-squares slope of log cost against log size over the
        ``last`` largest sizes (small sizes are dominated by fixed per-call costs)."""
        costs = (self.seconds if kind == "time" else self.memory)[name][-last:]
        if len(costs) < 2:
            raise ValueError(f"fitting an exponent needs at least 2 sizes, got {len(costs)}")
        xs = [math.log(n) for n in self.sizes[-last:]]
        ys = [math.log(max(c, 1e-12)) for c in costs]  # a 0-byte peak counts as tiny, not -inf
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        return (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
                / sum((x - mean_x) ** 2 for x in xs))

    def table(self, kind: Literal["time", "memory"] = "memory", last: int = 3) -> str:
        """A text table: one row per implementation, one column per size (milliseconds or MiB),
        and the fitted exponent."""
        unit, factor = ("ms", 1e3) if kind == "time" else ("MiB", 1 / 2**20)
        costs = self.seconds if kind == "time" else self.memory
        width = max(len(name) for name in costs) + 2
        lines = [f"{kind + ' (' + unit + ')':<{width}}"
                 + "".join(f"{'n=' + str(n):>9}" for n in self.sizes) + "  exponent"]
        for name, values in costs.items():
            lines.append(f"{name:<{width}}" + "".join(f"{factor * v:9.1f}" for v in values)
                         + f"{self.exponent(name, kind, last):10.2f}")
        return "\n".join(lines)


def scaling(implementations: dict[str, Callable[[T], object]], make_input: Callable[[int], T],
            sizes: list[int], device: torch.device | str = "cpu", repeats: int = 5,
            cpu_threads: int | None = None) -> Scaling:
    """Time (best of ``repeats``, :func:`wall_time`) and peak memory (:func:`peak_memory`) of
    every ``implementations[name](x)`` for ``x = make_input(n)``, n in ``sizes``, after one
    warm-up call each. Forward only: everything runs under ``torch.no_grad()``."""
    sizes = list(sizes)
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"sizes must be a non-empty increasing list, got {sizes}")
    if not implementations:
        raise ValueError("implementations is empty: nothing to measure")
    result = Scaling(sizes, {name: [] for name in implementations},
                     {name: [] for name in implementations})
    with torch.no_grad():
        for n in sizes:
            x = make_input(n)
            for name, fn in implementations.items():
                fn(x)  # first-call costs (allocator, kernel selection) are not the algorithm's
                result.memory[name].append(peak_memory(lambda: fn(x), device)[1])
                result.seconds[name].append(wall_time(lambda: fn(x), device, repeats, warmup=0,
                                                      cpu_threads=cpu_threads))
    return result
