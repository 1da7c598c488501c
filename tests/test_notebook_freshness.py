"""Stored notebook outputs come from the current code.

`make execute` records in each notebook's metadata a hash of its code cells and of the lecture_pkg
modules it imports (scripts/notebook_freshness.py). Here every chapter's record is compared with the
sources as they are now, and the hashing itself is checked on a small notebook and package built in
a temporary folder: it changes with code and imported modules, and only with those.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from notebook_freshness import CODE, KEY, source_hashes, staleness, stamp  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_come_from_current_sources(path: Path) -> None:
    problem = staleness(path)
    assert problem is None, problem


# ----- the hashing, on a temporary package and notebook -----

MODULES = {
    "__init__.py": "import os\n",
    "helpers.py": "def double(x):\n    return 2 * x\n",
    "core.py": "from lecture_pkg.helpers import double\n",
    "lazy.py": "def f():\n    from . import deep  # imported only when called\n",
    "deep.py": "DEPTH = 1\n",
    "unrelated.py": "X = 1\n",
    "sub/__init__.py": "from .leaf import LEAF\n",
    "sub/leaf.py": "LEAF = 0\n",
}


@pytest.fixture
def package(tmp_path: Path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / "lecture_pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lecture_pkg" / name).write_text(text)
    return tmp_path / "lecture_pkg"


def notebook(*code: str) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell("# A chapter")]
    cells += [nbformat.v4.new_code_cell(source) for source in code]
    return nbformat.v4.new_notebook(cells=cells)


CHAPTER = ('%pip install -q "lecture_pkg @ git+https://example.org/x"', "from lecture_pkg import core, lazy\n")


def test_hashes_name_the_imported_modules_transitively(package: Path) -> None:
    hashes = source_hashes(notebook(*CHAPTER), package)
    modules = sorted(key for key in hashes if key != CODE)
    # core -> helpers (absolute import), lazy -> deep (relative import inside a function);
    # __init__ always; unrelated and sub are never imported
    assert modules == [f"lecture_pkg/{name}.py" for name in ("__init__", "core", "deep", "helpers", "lazy")]
    nested = source_hashes(notebook("import lecture_pkg.sub as s"), package)
    assert sorted(nested) == [CODE, "lecture_pkg/__init__.py", "lecture_pkg/sub/__init__.py", "lecture_pkg/sub/leaf.py"]
    attribute = source_hashes(notebook("from lecture_pkg.sub import LEAF"), package)  # LEAF is no module
    assert sorted(attribute) == sorted(nested)


@pytest.mark.parametrize("module", ["__init__.py", "core.py", "helpers.py", "deep.py"])
def test_a_change_to_an_imported_module_changes_the_hash(package: Path, module: str) -> None:
    before = source_hashes(notebook(*CHAPTER), package)
    (package / module).write_text((package / module).read_text() + "# edited\n")
    after = source_hashes(notebook(*CHAPTER), package)
    assert {key for key in before if before[key] != after[key]} == {f"lecture_pkg/{module}"}


def test_an_unrelated_module_leaves_the_hash_alone(package: Path) -> None:
    before = source_hashes(notebook(*CHAPTER), package)
    (package / "unrelated.py").write_text("X = 2\n")
    assert source_hashes(notebook(*CHAPTER), package) == before


def test_a_new_import_in_a_module_adds_its_hash(package: Path) -> None:
    (package / "helpers.py").write_text("import lecture_pkg.unrelated\n")
    assert "lecture_pkg/unrelated.py" in source_hashes(notebook(*CHAPTER), package)


def test_code_changes_count_outputs_and_markdown_do_not(package: Path) -> None:
    nb = notebook(*CHAPTER, "print(core.double(2))")
    before = source_hashes(nb, package)

    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="4\n")]
    nb.cells[-1].execution_count = 7
    nb.cells[0].source = "# A chapter, reworded"
    assert source_hashes(nb, package) == before

    nb.cells[-1].source = "print(core.double(3))"
    assert source_hashes(nb, package)[CODE] != before[CODE]
    # moving code between cells is a change too
    assert source_hashes(notebook(*CHAPTER, "x = 1", "y = 2"), package) != source_hashes(
        notebook(*CHAPTER, "x = 1\ny = 2"), package)


def test_staleness_names_the_notebook_and_the_fix(package: Path, tmp_path: Path) -> None:
    path = tmp_path / "06_chapter.ipynb"
    nb = notebook(*CHAPTER)
    nbformat.write(nb, path)
    assert "has no record" in staleness(path, package)
    assert f"make execute NOTEBOOKS={path}" in staleness(path, package)

    stamp(path, nb, source_hashes(nb, package))
    assert nbformat.read(path, as_version=4).metadata[KEY] == source_hashes(nb, package)
    assert staleness(path, package) is None

    (package / "helpers.py").write_text("def double(x):\n    return x + x\n")
    problem = staleness(path, package)
    assert problem is not None and "lecture_pkg/helpers.py" in problem and "make execute NOTEBOOKS=" in problem

    nb = nbformat.read(path, as_version=4)  # recorded before the edit; now the code changes too
    nb.cells.append(nbformat.v4.new_code_cell("print(1)"))
    nbformat.write(nb, path)
    assert CODE in staleness(path, package)


def test_a_cell_that_does_not_parse_is_named(package: Path) -> None:
    with pytest.raises(SyntaxError, match="cell starting 'def broken\\(:'"):
        source_hashes(notebook(*CHAPTER, "def broken(:"), package)
