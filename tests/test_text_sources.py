"""Every chapter has one text source to edit and review: book/text/<name>.md (MyST markdown, paired
through jupytext), holding the same cells as the executed notebook book/<name>.ipynb.

Edit the text source, then `make execute NOTEBOOKS=book/<name>.ipynb` runs it and writes both files
(scripts/notebook_freshness.py). A notebook edited in Jupyter with jupytext installed keeps its pair
in sync by itself (the notebook's metadata names the pairing).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from notebook_freshness import PAIRING, read_text_source, text_source  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str, list[str]]]:
    """What a reader and reviewer see of each cell: its type, its source and its tags."""
    return [(cell.cell_type, cell.source, sorted(cell.get("metadata", {}).get("tags", [])))
            for cell in notebook.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_and_text_source_hold_the_same_cells(path: Path) -> None:
    fix = f"edit {text_source(path).relative_to(ROOT)} and run `make execute NOTEBOOKS={path.relative_to(ROOT)}`"
    assert text_source(path).is_file(), f"{path.name} has no text source: {fix}"
    notebook = nbformat.read(path, as_version=4)
    text, executed = cells(read_text_source(path)), cells(notebook)
    differing = [i for i, (a, b) in enumerate(zip(text, executed)) if a != b]
    assert len(text) == len(executed) and not differing, (
        f"{path.name} and its text source differ ({len(text)} vs {len(executed)} cells"
        f"{', first at cell ' + str(differing[0]) if differing else ''}): {fix}")
    assert notebook.metadata.get("jupytext") == PAIRING, f"{path.name} does not name its pairing"


def test_every_text_source_has_its_notebook() -> None:
    orphans = [p.name for p in (ROOT / "book" / "text").glob("*.md")
               if not (ROOT / "book" / f"{p.stem}.ipynb").exists()]
    assert not orphans, f"text sources without an executed notebook: {orphans} (run `make execute`)"
