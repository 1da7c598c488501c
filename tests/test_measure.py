"""The measuring helpers every chapter's cost section and every benchmark uses."""

from __future__ import annotations

import time

import pytest
import torch

from lecture_pkg.measure import peak_memory, wall_time


def test_peak_memory_sees_a_known_allocation() -> None:
    def allocate() -> float:
        big = torch.ones(16 * 2**20, dtype=torch.float32)  # 64 MiB, touched so it is resident
        return big.sum().item()

    peak_memory(allocate)  # warm up torch's first-use costs
    result, peak = peak_memory(allocate)
    assert result == 16 * 2**20
    assert 60 * 2**20 < peak < 80 * 2**20


def test_wall_time_statistics() -> None:
    durations = iter([0.03, 0.001, 0.001, 0.02])  # warm-up, then three timed runs

    def sleep_next() -> None:
        time.sleep(next(durations))

    assert 0.001 <= wall_time(sleep_next, repeats=3, warmup=1) < 0.015  # the minimum
    durations = iter([0.001, 0.02, 0.02])
    assert wall_time(sleep_next, repeats=3, warmup=0, statistic="median") >= 0.02
    with pytest.raises(ValueError, match="statistic"):
        wall_time(sleep_next, statistic="mean")  # type: ignore[arg-type]


def test_wall_time_pins_and_restores_cpu_threads() -> None:
    before = torch.get_num_threads()
    seen = []
    wall_time(lambda: seen.append(torch.get_num_threads()), repeats=2, warmup=0, cpu_threads=1)
    assert seen == [1, 1] and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="cpu_threads"):
        wall_time(lambda: None, cpu_threads=0)
