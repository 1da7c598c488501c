"""scripts/robustness.py: a notebook run under variants, its failing cells named, the table kept."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("robustness", ROOT / "scripts" / "robustness.py")
robustness = importlib.util.module_from_spec(spec)
sys.modules["robustness"] = robustness
spec.loader.exec_module(robustness)


def notebook(path: Path, cells: list[str]) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)
    return str(path)


def test_failing_cells_are_named_per_variant(tmp_path: Path) -> None:
    """A cell whose assert holds only at offset 0 fails under every shifted variant; the
    others pass, and the report names that cell (nbval's 'Cell N', code cells from 0)."""
    fragile = notebook(tmp_path / "fragile.ipynb", [
        "import lecture_pkg",
        "assert lecture_pkg.seeds(1) == [0]",  # true only for the stored seeds
        "x = 1",
    ])
    sturdy = notebook(tmp_path / "sturdy.ipynb", ["import lecture_pkg", "assert len(lecture_pkg.seeds(3)) == 3"])
    results = robustness.run_variant("seeds3000", [fragile, sturdy], workers=1, timeout=60,
                                     report_dir=tmp_path)
    assert results[fragile][0] == ["1"] and results[sturdy][0] == []
    assert robustness.describe(results[fragile][0]) == "FAIL cells 1"


def test_table_keeps_rows_of_notebooks_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Measured benchmark runs\n\nearlier sections\n")
    monkeypatch.setattr(robustness, "RESULTS", results_md)
    variants = ["seeds2000-default", "seeds3000"]
    robustness.write_table(variants, {"book/a.ipynb": {v: ([], 1.0) for v in variants},
                                      "book/b.ipynb": {v: (["4"], 2.0) for v in variants}})
    robustness.write_table(variants, {"book/b.ipynb": {v: ([], 3.0) for v in variants}})
    text = results_md.read_text()
    assert text.startswith("# Measured benchmark runs\n\nearlier sections\n")
    assert text.count(robustness.START) == 1 and text.count(robustness.END) == 1
    assert "| book/a.ipynb | pass (1 s) | pass (1 s) |" in text  # kept from the first run
    assert "| book/b.ipynb | pass (3 s) | pass (3 s) |" in text and "FAIL" not in text
