"""lecture_pkg's setup helpers and figure helpers."""

from __future__ import annotations

import random

import altair as alt
import numpy as np
import pytest
import torch

import lecture_pkg
from lecture_pkg import budget, cpu_threads, generator, get_device, is_large_budget, seed_everything, seeds, viz


def test_get_device_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LECTURE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert get_device().type == expected
    monkeypatch.setenv("LECTURE_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    if not torch.cuda.is_available():
        monkeypatch.setenv("LECTURE_DEVICE", "cuda")
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            get_device()


def test_seed_everything_makes_all_generators_repeat() -> None:
    seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(3))
    seed_everything(123)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)  # type: ignore[arg-type]


def test_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LECTURE_BUDGET", "small")
    assert budget(small=1, large=2) == 1 and not is_large_budget()
    monkeypatch.setenv("LECTURE_BUDGET", "large")
    assert budget(small=1, large=2) == 2
    monkeypatch.delenv("LECTURE_BUDGET")
    monkeypatch.setenv("LECTURE_DEVICE", "cpu")
    assert budget(small=1, large=2) == 1  # a CPU gets the small sizes
    # a GPU too: the default everywhere is the configuration CI executes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("LECTURE_DEVICE")
    assert budget(small=1, large=2) == 1 and not is_large_budget()
    monkeypatch.setenv("LECTURE_BUDGET", "huge")
    with pytest.raises(ValueError, match="LECTURE_BUDGET"):
        budget(1, 2)


def test_seeds_shift_with_the_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LECTURE_SEED_OFFSET", raising=False)
    assert seeds(3) == [0, 1, 2] and seeds(2, start=10) == [10, 11] and lecture_pkg.seed_offset() == 0
    monkeypatch.setenv("LECTURE_SEED_OFFSET", "1000")
    assert seeds(3) == [1000, 1001, 1002] and seeds(1, start=5) == [1005]
    assert torch.equal(torch.rand(3, generator=generator(5)),
                       torch.rand(3, generator=torch.Generator().manual_seed(1005)))
    for bad in ("-1", "1e3", "ten"):
        monkeypatch.setenv("LECTURE_SEED_OFFSET", bad)
        with pytest.raises(ValueError, match="LECTURE_SEED_OFFSET must be a non-negative integer"):
            seeds(1)
    monkeypatch.delenv("LECTURE_SEED_OFFSET")
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        seeds(0)
    with pytest.raises(ValueError, match="start must be an int >= 0"):
        seeds(2, start=-1)


def test_setup_notebook(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LECTURE_DEVICE", "cpu")
    monkeypatch.delenv("LECTURE_SEED_OFFSET", raising=False)
    monkeypatch.delenv("LECTURE_THREADS", raising=False)
    threads = torch.get_num_threads()
    try:
        assert lecture_pkg.setup_notebook(seed=3) == torch.device("cpu")
        assert "device: cpu" in capsys.readouterr().out
        assert alt.renderers.active == "html"
        assert alt.theme.active == "lecture"  # readable text sizes in the column
        assert torch.get_num_threads() == 1  # one thread: fast beside another busy process
        first = torch.rand(2)
        monkeypatch.setenv("LECTURE_SEED_OFFSET", "7")
        monkeypatch.setenv("LECTURE_THREADS", "2")
        lecture_pkg.setup_notebook(seed=3)
        assert "seed: 3 + offset 7" in capsys.readouterr().out and torch.get_num_threads() == 2
        shifted = torch.rand(2)
        seed_everything(10)
        assert torch.equal(torch.rand(2), shifted)  # seed 3 + offset 7
        seed_everything(3)
        assert torch.equal(torch.rand(2), first)  # offset 0 seeded with the seed itself
        monkeypatch.setenv("LECTURE_THREADS", "0")
        with pytest.raises(ValueError, match="LECTURE_THREADS must be a positive integer"):
            cpu_threads()
    finally:
        torch.set_num_threads(threads)


def test_long_form_and_heatmap() -> None:
    records = viz.long_form(torch.tensor([[0.25, 0.75], [1.0, 0.0]]), row_labels=["a", "b"], h=0.5)
    assert records[1] == {"query": "a", "key": 1, "weight": 0.75, "h": 0.5}
    spec = viz.heatmap(records).to_dict()
    assert spec["mark"]["type"] == "rect" and spec["encoding"]["y"]["sort"] == ["a", "b"]
    with pytest.raises(ValueError, match="2-D"):
        viz.long_form(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="labels"):
        viz.long_form(torch.zeros(2, 2), row_labels=["only one"])


def test_range_slider_and_filter() -> None:
    values = [0.1, 0.2, 0.3, 0.4]
    param = viz.range_slider("h", values)
    assert param.param.bind.step == pytest.approx(0.1) and param.param.value == 0.3
    assert viz.slider_filter(param, "h", values) == "abs(datum['h'] - h) < 0.05"
    with pytest.raises(ValueError, match="evenly spaced"):
        viz.range_slider("h", [0.1, 0.2, 0.5])
    with pytest.raises(ValueError, match="at least two"):
        viz.range_slider("h", [0.1])


def test_show_source_displays_package_code() -> None:
    code = viz.show_source(lecture_pkg.budget)
    assert "def budget(small: T, large: T) -> T:" in code.data
    assert '"""Return ``small``' in code.data


def test_show_source_can_leave_out_the_docstring() -> None:
    code = viz.show_source(lecture_pkg.budget, docstring=False).data
    assert code == 'def budget(small: T, large: T) -> T:\n    return large if is_large_budget() else small\n'
    from lecture_pkg.models.detr import DETR

    method = viz.show_source(DETR.predict, docstring=False).data  # dedented, decorator kept
    assert method.startswith("@torch.no_grad()\ndef predict(self") and '"""' not in method


@pytest.mark.parametrize("display", [False, True])
def test_glue_writes_what_myst_nb_glue_writes(monkeypatch: pytest.MonkeyPatch, display: bool) -> None:
    """viz.glue (which chapters use where myst-nb is not installed) emits the same display data
    and metadata as myst-nb's own glue, which the book build reads."""
    import IPython.display
    from myst_nb import glue as myst_glue

    shown: list[tuple[dict, dict]] = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw, metadata: shown.append((data, metadata)))
    import myst_nb.ext.glue
    monkeypatch.setattr(myst_nb.ext.glue, "ipy_display",
                        lambda data, raw, metadata: shown.append((data, metadata)))
    value = 0.1234567
    viz.glue("ratio", value, display=display)
    myst_glue("ratio", value, display=display)
    assert len(shown) == 2 and shown[0] == shown[1]
    assert shown[0][1]["scrapbook"]["name"] == "ratio"
    with pytest.raises(ValueError, match="name must be"):
        viz.glue("two words", value)


def test_glue_all_glues_each_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object, bool]] = []
    monkeypatch.setattr(viz, "glue", lambda name, value, display=False: calls.append((name, value, display)))
    viz.glue_all(ratio=0.5, steps=12)
    assert calls == [("ratio", 0.5, False), ("steps", 12, False)]
