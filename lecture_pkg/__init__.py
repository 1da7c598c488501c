"""lecture_pkg: the implementations behind the Transformers textbook.

The helpers here are what every chapter's setup cell uses:

* :func:`get_device` picks CUDA, then Apple MPS, then the CPU (``LECTURE_DEVICE`` overrides);
* :func:`seeds` gives an experiment its seeds, all shifted by ``$LECTURE_SEED_OFFSET`` so that CI
  can run the book on numbers it did not store; :func:`seed_everything` seeds the global generators;
* :func:`budget` picks a problem size: the small one, which CI executes, on every device unless
  ``LECTURE_BUDGET=large`` asks for the large one (not yet verified on a GPU).

The package map, one line per module (the library first, then the book's experiments and
shipped models), is the "Layout" section of the repository's README.md.
"""

from __future__ import annotations

import os
import random
from typing import TypeVar

import numpy as np
import torch

__all__ = ["budget", "cpu_threads", "generator", "get_device", "is_large_budget", "seed_everything",
           "seed_offset", "seeds", "setup_notebook"]

T = TypeVar("T")


def get_device() -> torch.device:
    """The device chapters run on: ``$LECTURE_DEVICE`` if set, else cuda, then mps, then cpu."""
    requested = os.environ.get("LECTURE_DEVICE", "").strip()
    if requested:
        device = torch.device(requested)  # raises a clear RuntimeError for a malformed name
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"LECTURE_DEVICE={requested!r} but CUDA is not available here")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"LECTURE_DEVICE={requested!r} but MPS is not available here")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (all CUDA devices included)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def seed_offset() -> int:
    """The shift ``$LECTURE_SEED_OFFSET`` adds to every seed (a non-negative int; 0 when unset).

    The stored outputs use offset 0; CI and ``make robustness`` run the book with other offsets,
    so a claim a chapter asserts must hold for any seeds, not only for the ones that were stored.
    """
    raw = os.environ.get("LECTURE_SEED_OFFSET", "").strip()
    if not raw:
        return 0
    try:
        offset = int(raw)
    except ValueError:
        raise ValueError(f"LECTURE_SEED_OFFSET must be a non-negative integer, got {raw!r}") from None
    if offset < 0:
        raise ValueError(f"LECTURE_SEED_OFFSET must be a non-negative integer, got {raw!r}")
    return offset


def seeds(n: int, start: int = 0) -> list[int]:
    """``n`` seeds for an experiment: ``start, start + 1, ...`` shifted by :func:`seed_offset`.

    Every random choice of an experiment (data, initialisation, sampling) draws from these, e.g.
    ``for seed in seeds(3): ...``; two experiments in one chapter that must not share seeds use
    different ``start`` values.
    """
    for name, value, least in (("n", n, 1), ("start", start, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    offset = seed_offset()
    return [offset + start + i for i in range(n)]


def generator(index: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seeds(1, start=index)[0]``.

    The chapter's one-liner for random inputs: ``x = torch.randn(4, 8, generator=generator(3))``.
    """
    return torch.Generator(device=device).manual_seed(seeds(1, start=index)[0])


def is_large_budget() -> bool:
    """True only when ``LECTURE_BUDGET=large`` asks for the chapters' large sizes.

    The default on every device, a GPU included, is the small configuration: the one CI executes
    and whose asserts are checked. ``large`` is an explicit opt-in that has not yet been verified
    (no run of the whole book at the large sizes has passed); ``small`` or unset gives the default.
    """
    choice = os.environ.get("LECTURE_BUDGET", "").strip().lower()
    if choice not in ("", "small", "large"):
        raise ValueError(f"LECTURE_BUDGET must be 'small' or 'large', got {choice!r}")
    return choice == "large"


def budget(small: T, large: T) -> T:
    """Return ``small`` (what CI executes, on every device) unless ``LECTURE_BUDGET=large``.

    Chapters size their experiments with it, e.g. ``n = budget(small=512, large=8192)``.
    """
    return large if is_large_budget() else small


def cpu_threads() -> int:
    """Threads torch uses on the CPU: ``$LECTURE_THREADS`` if set, else 1.

    One thread, because the book's operations are small: a second thread gains little on an idle
    machine, and beside one other busy process two threads waiting for each other at every
    operation made 100 training steps ten times slower (``benchmarks/threads.py``).
    """
    raw = os.environ.get("LECTURE_THREADS", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"LECTURE_THREADS must be a positive integer, got {raw!r}")
    return int(raw)


def setup_notebook(seed: int = 0) -> torch.device:
    """Everything the first cell of a chapter does after installing: seed the global generators
    with ``seed`` shifted by :func:`seed_offset`, set the CPU thread count (:func:`cpu_threads`),
    configure the figure pipeline (see :mod:`lecture_pkg.viz`), report and return the device.

    The numbers a chapter prints are not the same on every machine: floating-point sums depend on
    the CPU's vector kernels (AVX2, AVX-512, ...) and the thread count, and seeds shift with
    ``$LECTURE_SEED_OFFSET``. What a chapter asserts must therefore hold on any of them.
    """
    from lecture_pkg import viz  # imported here so that `import lecture_pkg` needs no altair

    shifted = seeds(1, start=seed)[0]
    seed_everything(shifted)
    viz.configure()
    device = get_device()
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads())
    offset = seed_offset()
    shown = f"{seed}" if offset == 0 else f"{seed} + offset {offset}"
    print(f"device: {device.type} | budget: {'large' if is_large_budget() else 'small'} | seed: {shown}")
    return device
