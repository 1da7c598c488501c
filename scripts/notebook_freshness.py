"""Record which sources a notebook's stored outputs came from, so a test can tell when they are stale.

`make execute` runs a notebook and writes into its metadata, under "executed_from", a short hash of
its code cells and of every lecture_pkg module the notebook imports: directly, or through other
package modules (followed with `ast`, lazy imports inside functions included). lecture_pkg/__init__.py
always counts, since importing any submodule runs it. tests/test_notebook_freshness.py recomputes the
hashes and names the notebook, and the source, whose outputs are older than the code. Markdown,
outputs and unrelated modules are not hashed: changing them never calls for a re-run.

Every notebook is paired with a text source, `book/text/<name>.md` (MyST markdown through jupytext),
which holds its cells without outputs and is what a chapter is edited in. `execute` reads the cells
from the text source (creating the notebook when it does not exist yet), runs them and writes both
files; `pair` writes the text source from the notebook. tests/test_text_sources.py checks that each
pair holds the same cells.

    python scripts/notebook_freshness.py execute book/02_attention.ipynb ...  # run, then record
    python scripts/notebook_freshness.py stamp book/02_attention.ipynb ...    # record only
    python scripts/notebook_freshness.py pair book/02_attention.ipynb ...     # notebook -> text
    python scripts/notebook_freshness.py prose book/02_attention.ipynb ...    # text -> notebook,
                                                         # when only markdown changed: no re-run
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
from pathlib import Path

import jupytext
import nbformat
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "lecture_pkg"
KEY = "executed_from"
CODE = "code cells"
TEXT_FORMAT = "md:myst"
PAIRING = {"formats": "ipynb,text//md:myst"}  # jupytext's notation for book/text/<name>.md


def text_source(path: Path) -> Path:
    """The text source paired with the notebook at `path`: book/text/<name>.md."""
    return path.parent / "text" / f"{path.stem}.md"


def read_text_source(path: Path) -> nbformat.NotebookNode:
    """The cells of the notebook at `path` as its text source holds them (no outputs)."""
    return jupytext.read(text_source(path), fmt=TEXT_FORMAT)


def write_text_source(path: Path, notebook: nbformat.NotebookNode) -> None:
    notebook.metadata["jupytext"] = dict(PAIRING)
    text_source(path).parent.mkdir(exist_ok=True)
    jupytext.write(notebook, text_source(path), fmt=TEXT_FORMAT)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _cell_python(source: str) -> str:
    """A code cell as plain Python: IPython magics (`%pip ...`) become calls. A cell magic such as
    `%%time` keeps its body as a string, so its first line is dropped to read the body itself."""
    if source.startswith("%%"):
        source = source.partition("\n")[2]
    return TransformerManager().transform_cell(source)


def _imported_modules(tree: ast.AST, package: str, module: str = "", is_package: bool = False) -> set[str]:
    """Dotted names under `package` that `tree` imports, each with its parent packages. `module` is
    the name of the file being read (empty for a notebook), needed for relative imports. Names
    imported `from` a package are kept whether they are submodules or attributes; the caller keeps
    those that are files."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: start from the package holding `module`
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    ours = {name for name in names if name == package or name.startswith(package + ".")}
    return {".".join(name.split(".")[:i]) for name in ours for i in range(1, name.count(".") + 2)}


def _module_file(name: str, package_dir: Path) -> Path | None:
    """The file of module `name` (a package's __init__.py), or None for an attribute."""
    relative = Path(*name.split(".")[1:])
    for candidate in (package_dir / relative / "__init__.py", (package_dir / relative).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def dependencies(notebook: nbformat.NotebookNode, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The package's source files the notebook's code cells import, transitively, sorted."""
    package = package_dir.name
    pending: set[str] = {package}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            try:
                tree = ast.parse(_cell_python(cell.source))
            except SyntaxError as error:
                first_line = cell.source.partition("\n")[0]
                raise SyntaxError(f"the code cell starting {first_line!r} does not parse: {error}") from error
            pending |= _imported_modules(tree, package)
    seen: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        path = _module_file(name, package_dir)
        if path is None or name in seen:
            continue
        seen[name] = path
        tree = ast.parse(path.read_bytes(), filename=str(path))
        pending |= _imported_modules(tree, package, name, is_package=path.name == "__init__.py") - seen.keys()
    return sorted(seen.values())


def source_hashes(notebook: nbformat.NotebookNode, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{"code cells": hash, "lecture_pkg/<module>.py": hash, ...}: what the outputs depend on."""
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    hashes = {CODE: _digest(json.dumps(code).encode())}
    for path in dependencies(notebook, package_dir):
        hashes[path.relative_to(package_dir.parent).as_posix()] = _digest(path.read_bytes())
    return hashes


def staleness(path: Path, package_dir: Path = PACKAGE_DIR) -> str | None:
    """Why the stored outputs of the notebook at `path` may not come from the current sources, or
    None when they do."""
    notebook = nbformat.read(path, as_version=4)
    recorded = notebook.metadata.get(KEY)
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    fix = f"run `make execute NOTEBOOKS={name}` and commit the notebook"
    if recorded is None:
        return f"{name} has no record of the sources its outputs came from: {fix}"
    current = source_hashes(notebook, package_dir)
    changed = sorted(key for key in current.keys() | recorded.keys() if current.get(key) != recorded.get(key))
    if changed:
        return f"{name}: stored outputs are older than the current {', '.join(changed)}: {fix}"
    return None


def stamp(path: Path, notebook: nbformat.NotebookNode, hashes: dict[str, str]) -> None:
    notebook.metadata[KEY] = hashes
    nbformat.write(notebook, path)


def execute(path: Path, timeout: int) -> None:
    """Run the cells of the notebook's text source from the notebook's folder, write the notebook
    with their outputs and record the sources it ran with. The hashes are taken before the run, so
    a source edited meanwhile shows up as stale, never as current."""
    from nbclient import NotebookClient

    notebook = read_text_source(path)
    notebook.metadata.pop(KEY, None)
    notebook.metadata.setdefault("kernelspec", {"display_name": "Python 3", "language": "python",
                                                "name": "python3"})
    hashes = source_hashes(notebook)
    NotebookClient(notebook, timeout=timeout, resources={"metadata": {"path": str(path.parent)}}).execute()
    write_text_source(path, notebook)
    stamp(path, notebook, hashes)


def update_prose(path: Path) -> None:
    """Bring the text source's markdown into the notebook, keeping its outputs. Refused when a code
    cell differs: outputs then have to come from running the new code (`execute`)."""
    from jupytext.combine import combine_inputs_with_outputs

    text, executed = read_text_source(path), nbformat.read(path, as_version=4)
    code = [[c.source for c in nb.cells if c.cell_type == "code"] for nb in (text, executed)]
    if code[0] != code[1]:
        raise SystemExit(f"{path}: code cells changed in {text_source(path)}; run `execute` instead")
    combined = combine_inputs_with_outputs(text, executed, fmt=TEXT_FORMAT)
    combined.metadata[KEY] = executed.metadata[KEY]
    combined.metadata["jupytext"] = dict(PAIRING)
    nbformat.write(combined, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["execute", "stamp", "pair", "prose"])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (execute)")
    args = parser.parse_args()
    for path in args.notebooks:
        print(f"{args.action}: {path}", flush=True)
        if args.action == "execute":
            execute(path, args.timeout)
        elif args.action == "prose":
            update_prose(path)
        elif args.action == "stamp":
            notebook = nbformat.read(path, as_version=4)
            stamp(path, notebook, source_hashes(notebook))
        else:
            notebook = nbformat.read(path, as_version=4)
            write_text_source(path, notebook)
            nbformat.write(notebook, path)


if __name__ == "__main__":
    main()
