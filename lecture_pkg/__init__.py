"""lecture_pkg: the implementations behind the Transformers textbook.

The helpers here are what every chapter's setup cell uses:

* :func:`get_device` picks CUDA, then Apple MPS, then the CPU (``LECTURE_DEVICE`` overrides);
* :func:`seed_everything` makes a chapter reproducible;
* :func:`budget` picks a problem size: small on a CPU (and in CI), larger on a GPU, so that every
  chapter executes on two CPU cores in about a minute and scales up where a GPU is present.
"""

from __future__ import annotations

import os
import random
from typing import TypeVar

import numpy as np
import torch

__all__ = ["budget", "get_device", "is_large_budget", "seed_everything", "setup_notebook"]

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


def is_large_budget() -> bool:
    """True when chapters should use their large sizes.

    ``$LECTURE_BUDGET`` (``small`` or ``large``) decides when set; otherwise large means "a GPU
    is present". CI and plain CPU runs therefore get the small sizes.
    """
    choice = os.environ.get("LECTURE_BUDGET", "").strip().lower()
    if choice not in ("", "small", "large"):
        raise ValueError(f"LECTURE_BUDGET must be 'small' or 'large', got {choice!r}")
    if choice:
        return choice == "large"
    return get_device().type == "cuda"


def budget(small: T, large: T) -> T:
    """Return ``small`` on a CPU or in CI and ``large`` on a GPU (see :func:`is_large_budget`).

    Chapters size their experiments with it, e.g. ``n = budget(small=512, large=8192)``.
    """
    return large if is_large_budget() else small


def setup_notebook(seed: int = 0) -> torch.device:
    """Everything the first cell of a chapter does after installing: seed, configure the figure
    pipeline (see :mod:`lecture_pkg.viz`), report and return the device."""
    from lecture_pkg import viz  # imported here so that `import lecture_pkg` needs no altair

    seed_everything(seed)
    viz.configure()
    device = get_device()
    if device.type == "cpu":
        # Float sums are reduced in an order that depends on the thread count, so a fixed count
        # makes a chapter's numbers the same on every machine with at least two cores.
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(f"device: {device.type} | budget: {'large' if is_large_budget() else 'small'} | seed: {seed}")
    return device
