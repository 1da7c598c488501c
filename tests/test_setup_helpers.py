"""lecture_pkg's setup helpers and figure helpers."""

from __future__ import annotations

import os
import random

import altair as alt
import numpy as np
import pytest
import torch

import lecture_pkg
from lecture_pkg import budget, get_device, is_large_budget, seed_everything, viz


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
    monkeypatch.setenv("LECTURE_BUDGET", "huge")
    with pytest.raises(ValueError, match="LECTURE_BUDGET"):
        budget(1, 2)


def test_setup_notebook(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LECTURE_DEVICE", "cpu")
    assert lecture_pkg.setup_notebook(seed=3) == torch.device("cpu")
    assert "device: cpu" in capsys.readouterr().out
    assert alt.renderers.active == "html"
    assert alt.theme.active == "lecture"  # readable text sizes in the column
    assert torch.get_num_threads() == min(2, os.cpu_count() or 1)  # results reproduce across machines


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
