"""The measuring helpers every chapter's cost section and every benchmark uses."""

from __future__ import annotations

import time

import pytest
import torch

from lecture_pkg.measure import (
    Scaling,
    peak_memory,
    saved_tensor_bytes,
    scaling,
    tensor_peak_memory,
    wall_time,
)


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


def test_scaling_measures_every_implementation_and_fits_exponents() -> None:
    def quadratic(n: int) -> float:
        return torch.ones(n, n).sum().item()  # n^2 floats: 4, 16, 64 MiB

    def linear(n: int) -> float:
        return torch.ones(n, 1024).sum().item()  # n * 1024 floats: 4, 8, 16 MiB

    result = scaling({"quadratic": quadratic, "linear": linear}, lambda n: n,
                     [1024, 2048, 4096], repeats=2)
    assert result.sizes == [1024, 2048, 4096]
    assert all(len(result.seconds[name]) == len(result.memory[name]) == 3 for name in
               ("quadratic", "linear"))
    assert 60 * 2**20 < result.memory["quadratic"][-1] < 80 * 2**20
    assert 1.8 < result.exponent("quadratic") < 2.2
    assert 0.8 < result.exponent("linear") < 1.2
    assert all(s > 0 for s in result.seconds["quadratic"] + result.seconds["linear"])
    lines = result.table("memory").splitlines()
    assert lines[0].split()[:2] == ["memory", "(MiB)"] and "n=4096" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["quadratic", "linear"]
    assert result.table("time").startswith("time (ms)")


def test_scaling_exponent_is_the_log_log_slope() -> None:
    exact = Scaling([1, 2, 4, 8], seconds={"cubic": [9.0, 1.0, 8.0, 64.0]},
                    memory={"cubic": [0, 2, 8, 32]})
    assert exact.exponent("cubic", "time") == pytest.approx(3.0)  # the last 3 sizes only
    assert exact.exponent("cubic", "memory") == pytest.approx(2.0)
    assert exact.exponent("cubic", "time", last=4) != pytest.approx(3.0)
    with pytest.raises(ValueError, match="at least 2"):
        exact.exponent("cubic", last=1)


def test_scaling_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="increasing"):
        scaling({"f": lambda n: n}, lambda n: n, [4, 2])
    with pytest.raises(ValueError, match="increasing"):
        scaling({"f": lambda n: n}, lambda n: n, [])
    with pytest.raises(ValueError, match="empty"):
        scaling({}, lambda n: n, [1, 2])


def test_tensor_peak_memory_counts_live_tensors_not_views() -> None:
    def allocate() -> torch.Tensor:
        a = torch.ones(2**20)  # 4 MiB
        b = a * 2  # 8 MiB alive
        del a
        c = torch.ones(2**21)  # 4 + 8 = 12 MiB alive: the peak
        c.add_(1)  # in place: nothing new
        view = c[:10]  # a view: nothing new
        return b[:1] + view[:1]

    result, peak = tensor_peak_memory(allocate)
    assert result.tolist() == [4.0]
    assert 12 * 2**20 <= peak < 12 * 2**20 + 1024  # + the few bytes of the small results


def test_tensor_peak_memory_equals_the_profilers_allocator_peak() -> None:
    # the independent reference: the CPU allocator's own events, recorded by torch.profiler
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(128, 64)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer state exists from now on
    _, peak = tensor_peak_memory(step)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    current = reference = 0
    for event in events:
        current += event.nbytes()
        reference = max(reference, current)
    assert peak == reference


def test_saved_tensor_bytes_sees_what_backward_needs() -> None:
    linear = torch.nn.Linear(256, 128)
    x = torch.randn(64, 256)
    # linear saves its input (64 x 256), relu its output (64 x 128); parameters excluded
    _, saved = saved_tensor_bytes(lambda: linear(x).relu().sum(),
                                  exclude=list(linear.parameters()))
    assert saved == 4 * (64 * 256 + 64 * 128)
    linear.requires_grad_(False)
    _, frozen = saved_tensor_bytes(lambda: linear(x).relu().sum())
    assert frozen == 0  # nothing requires a gradient: nothing is saved
