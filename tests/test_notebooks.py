"""Rules every chapter notebook follows (the anatomy in CONVENTIONS.md).

The setup cell is derived from the repository URL in _config.yml, which is written nowhere else.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
MAX_BYTES = 2_000_000
MAX_COLUMNS = 88  # wider code lines get a horizontal scroll bar in the HTML book


def chapter_extra(path: Path) -> str:
    """The pyproject extra a chapter installs: its group's (chapters 1-6 share `core`)."""
    return {"07": "pretrained", "08": "vision", "09": "lora", "10": "alignment"}.get(path.stem[:2], "core")


def setup_cell_source(extra: str) -> str:
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    return (
        "# Setup, the first cell of every chapter: where lecture_pkg is missing (a fresh\n"
        "# google.colab runtime, a new local environment), install it with this chapter's extra.\n"
        "# Colab's own torch is kept, and no restart is needed (whatever pip's note says).\n"
        "# Then seed, set up figures and pick the device.\n"
        "import importlib.util\n"
        "\n"
        'if importlib.util.find_spec("lecture_pkg") is None:\n'
        f'    REPO = "git+{url}"\n'
        f'    %pip install -q "lecture_pkg[{extra}] @ {{REPO}}"\n'  # IPython expands {REPO}
        "\n"
        "from lecture_pkg import budget, setup_notebook\n"
        "\n"
        "device = setup_notebook(seed=0)"
    )


def toc_files() -> list[str]:
    """Every page _toc.yml lists: the root, then chapters and their sections, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())

    def pages(entries: list[dict]) -> list[str]:
        return [p for entry in entries for p in [entry["file"], *pages(entry.get("sections", []))]]

    chapters = [c for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]) for c in part["chapters"]]
    return [toc["root"], *pages(chapters)]


def code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code"]


def test_there_are_chapters() -> None:
    assert NOTEBOOKS, "book/ holds no notebooks"


def test_toc_entries_exist() -> None:
    for entry in toc_files():
        candidates = [ROOT / f"{entry}{ext}" for ext in (".md", ".ipynb")]
        assert any(p.exists() for p in candidates), f"_toc.yml lists {entry}, which does not exist"


def test_notebooks_are_one_level_deep() -> None:
    nested = [p for p in BOOK.rglob("*.ipynb")
              if p.parent != BOOK and "_build" not in p.parts and ".ipynb_checkpoints" not in p.parts]
    assert not nested, f"notebooks must live directly in book/: {nested}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
class TestChapter:
    def test_listed_in_toc(self, path: Path) -> None:
        assert f"book/{path.stem}" in toc_files(), f"{path.name} is not listed in _toc.yml"

    def test_starts_with_setup_cell(self, path: Path) -> None:
        first = "".join(code_cells(path)[0]["source"])
        assert first == setup_cell_source(chapter_extra(path)), \
            f"{path.name}: first code cell differs from the setup cell"

    def test_executed_without_errors(self, path: Path) -> None:
        cells = code_cells(path)
        assert all(c.get("execution_count") for c in cells if "".join(c["source"]).strip()), \
            f"{path.name} has unexecuted code cells: run `make execute`"
        errors = [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]
        assert not errors, f"{path.name} stores an error output: {errors[0].get('ename')}"

    def test_checked_cells_have_output(self, path: Path) -> None:
        for cell in code_cells(path):
            if "# NBVAL_CHECK_OUTPUT" in "".join(cell["source"]):
                assert cell.get("outputs"), f"{path.name}: a NBVAL_CHECK_OUTPUT cell has no output"

    def test_size_budget(self, path: Path) -> None:
        assert path.stat().st_size <= MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes"

    def test_has_exercises_with_hidden_solutions(self, path: Path) -> None:
        cells = json.loads(path.read_text())["cells"]
        hidden = [c for c in cells if c["cell_type"] == "code"
                  and {"hide-cell", "hide-input"} & set(c.get("metadata", {}).get("tags", []))
                  and re.search(r"^\s*assert ", "".join(c["source"]), re.M)]
        assert hidden, f"{path.name}: no hidden exercise solution checked by an assert"

    def test_code_lines_fit_the_page(self, path: Path) -> None:
        """Every code line within MAX_COLUMNS, the setup cell included."""
        cells = json.loads(path.read_text())["cells"]
        code_indices = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
        too_wide = [f"{path.name}, cell {i}, line {n}: {len(line)} columns"
                    for i in code_indices
                    for n, line in enumerate("".join(cells[i]["source"]).splitlines(), 1)
                    if len(line) > MAX_COLUMNS]
        assert not too_wide, (f"{len(too_wide)} code lines over {MAX_COLUMNS} columns:\n"
                              + "\n".join(too_wide))


@functools.cache
def _requirement_closure(requirements: tuple[str, ...]) -> set[str]:
    """Normalised names of the distributions these requirement strings pull in, transitively
    (extras followed; environment markers of the installed Python honoured)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    pending = [(Requirement(r), "") for r in requirements]
    while pending:
        req, extra = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        key = canonicalize_name(req.name) + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            wanted = [e for e in req.extras if sub.marker is not None and sub.marker.evaluate({"extra": e})]
            if sub.marker is None or sub.marker.evaluate({"extra": ""}) or wanted:
                pending.append((sub, wanted[0] if wanted else ""))
    return {key.split("[")[0] for key in seen}


@functools.cache
def _import_providers() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_extra_provides_every_import(path: Path) -> None:
    """What a chapter imports is installed by the extra its setup cell names (plus Colab's or your
    torch), so a fresh Colab runtime runs it after the first cell."""
    import ast
    import sys

    import tomllib
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = chapter_extra(path)
    closure = _requirement_closure((*project["dependencies"], *project["optional-dependencies"][extra]))
    closure |= {"torch", "ipython", "ipykernel"}  # the notebook's kernel itself
    providers = _import_providers()
    imported: set[str] = set()
    for cell in code_cells(path):
        source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                           if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"lecture_pkg", "__future__"}
    missing = {name: providers.get(name, [name]) for name in sorted(third_party)
               if not any(canonicalize_name(d) in closure for d in providers.get(name, [name]))}
    assert not missing, f"{path.name} imports {missing}, which lecture_pkg[{extra}] does not install"


NBVAL_TIMEOUT_MARGIN = 3  # a loaded CI machine runs a cell up to ~3x slower than an idle one


def nbval_cell_timeout() -> int:
    makefile = (ROOT / "Makefile").read_text()
    return int(re.search(r"--nbval-cell-timeout=(\d+)", makefile).group(1))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_fits_the_nbval_timeout_with_margin(path: Path) -> None:
    """The slowest cell of the recorded execution (two cores) takes at most a third of nbval's
    per-cell timeout, so the timeout survives a machine three times slower."""
    from datetime import datetime

    def seconds(cell: dict) -> float:
        times = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in times or "shell.execute_reply" not in times:
            return 0.0
        start, end = (datetime.fromisoformat(times[k].replace("Z", "+00:00"))
                      for k in ("iopub.execute_input", "shell.execute_reply"))
        return (end - start).total_seconds()

    durations = [(seconds(cell), index) for index, cell in enumerate(code_cells(path))]
    worst, index = max(durations)
    limit = nbval_cell_timeout() / NBVAL_TIMEOUT_MARGIN
    assert worst <= limit, (f"{path.name}: code cell {index} took {worst:.0f} s when executed, over "
                            f"{limit:.0f} s (nbval's timeout / {NBVAL_TIMEOUT_MARGIN}): split it or shrink it")


def _shows_a_figure(cell: dict) -> bool:
    """A chart (altair/vega), an image, a widget or a bertviz view among the cell's outputs."""
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        html = "".join(data.get("text/html", ""))
        if ("image/png" in data or "application/vnd.jupyter.widget-view+json" in data
                or "vegaEmbed" in html or "bertviz-" in html):
            return True
    return False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_has_a_caption_below_it(path: Path) -> None:
    """The cell after a figure is a caption: an italic paragraph saying what to see."""
    cells = json.loads(path.read_text())["cells"]
    uncaptioned = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code" and _shows_a_figure(cell):
            following = cells[index + 1] if index + 1 < len(cells) else None
            text = "".join(following["source"]).lstrip() if following else ""
            if not (following and following["cell_type"] == "markdown" and text.startswith("*")):
                uncaptioned.append(index)
    assert not uncaptioned, f"{path.name}: figures without a caption below them, cells {uncaptioned}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_glued_values_are_plain_python(path: Path) -> None:
    """Glued numbers are Python ints/floats/strings: the book formats their text/plain form
    ({glue:text}`name:.3f`), which fails for NumPy or torch reprs such as np.float64(0.85)."""
    bad = []
    for cell in code_cells(path):
        for output in cell.get("outputs", []):
            if "scrapbook" not in output.get("metadata", {}):
                continue
            plain = "".join(next((v for k, v in output.get("data", {}).items() if k.endswith("text/plain")), ""))
            if re.match(r"(np\.|numpy\.|tensor\(|array\()", plain):
                bad.append(f"{output['metadata']['scrapbook']['name']} = {plain}")
    assert not bad, f"{path.name}: glue plain Python values (float(...), .item()): {bad[:3]}"
