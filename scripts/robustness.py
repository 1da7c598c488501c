"""Execute notebooks under variants the book did not store, and report which cells fail.

A variant is an environment: another seed set (``LECTURE_SEED_OFFSET``) and/or another CPU kernel
path (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``). Every notebook runs under nbval
(``--nbval-lax``: the ``# NBVAL_CHECK_OUTPUT`` worked examples must match their stored output
exactly, every other cell must run, and so every assert must hold). The report names, per
notebook and variant, the failing cells; ``--write`` puts it as a table into
``benchmarks/RESULTS.md`` (the section between the robustness markers; rows of notebooks not run
this time are kept).

    python scripts/robustness.py                                  # the default variants, every notebook
    python scripts/robustness.py --variant ci book/06d_ablations.ipynb
    python scripts/robustness.py --write                          # and update benchmarks/RESULTS.md

Exit status 1 when any cell fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
START, END = "<!-- robustness:start -->", "<!-- robustness:end -->"

# "ci" is the variant `make test`'s nbval runs; `make robustness` runs the further two.
VARIANTS: dict[str, dict[str, str]] = {
    "ci": {"LECTURE_SEED_OFFSET": "1000", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "seeds2000-default": {"LECTURE_SEED_OFFSET": "2000", "ATEN_CPU_CAPABILITY": "default"},
    "seeds3000": {"LECTURE_SEED_OFFSET": "3000"},
}
DEFAULT = ["seeds2000-default", "seeds3000"]


def run_variant(name: str, notebooks: list[str], workers: int, timeout: int,
                report_dir: Path = ROOT / "_build" / "robustness") -> dict[str, tuple[list[str], float]]:
    """Run nbval under variant ``name``: {notebook: (failing cells, seconds)}."""
    report = report_dir / f"{name}-{os.getpid()}.xml"  # concurrent runs do not share a report
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **VARIANTS[name]}
    parallel = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *parallel, "--nbval-lax",
                    "--nbval-current-env", f"--nbval-cell-timeout={timeout}", f"--junitxml={report}", "-q",
                    *notebooks], cwd=ROOT, env=env, check=False)
    results: dict[str, tuple[list[str], float]] = {nb: ([], 0.0) for nb in notebooks}
    if not report.exists():
        return {nb: (["did not run"], 0.0) for nb in notebooks}
    ran: set[str] = set()
    for case in ET.parse(report).iter("testcase"):
        notebook = next((nb for nb in notebooks if Path(nb).stem in case.get("classname", "") + case.get("file", "")
                         + case.get("name", "")), None)
        if notebook is None:
            continue
        ran.add(notebook)
        failed, seconds = results[notebook]
        if case.find("failure") is not None or case.find("error") is not None:
            cell = re.search(r"Cell (\d+)", case.get("name", ""))
            failed.append(cell.group(1) if cell else case.get("name", "?"))
        results[notebook] = (failed, seconds + float(case.get("time", 0.0)))
    report.unlink()
    return {nb: results[nb] if nb in ran else (["no cell ran"], 0.0) for nb in notebooks}


def describe(failed: list[str]) -> str:
    return "pass" if not failed else "FAIL cells " + ", ".join(failed)


def write_table(variants: list[str], results: dict[str, dict[str, tuple[list[str], float]]]) -> None:
    """Replace the robustness section of RESULTS.md, keeping rows of notebooks not run now."""
    text = RESULTS.read_text()
    rows: dict[str, str] = {}
    header = f"| notebook | {' | '.join(variants)} | date |"
    if START in text:
        old = text[text.index(START):text.index(END)]
        if header in old:  # rows from an earlier run with the same variants
            rows = {line.split("|")[1].strip(): line for line in old.splitlines() if line.startswith("| book/")}
    today = dt.date.today().isoformat()
    for notebook, by_variant in results.items():
        cells = [f"{describe(by_variant[v][0])} ({by_variant[v][1]:.0f} s)" for v in variants]
        rows[notebook] = f"| {notebook} | {' | '.join(cells)} | {today} |"
    legend = "; ".join(f"`{v}`: {' '.join(f'{k}={x}' for k, x in VARIANTS[v].items())}" for v in variants)
    section = "\n".join([
        START,
        "## Robustness: every notebook on seeds and kernels the book did not store (`make robustness`)",
        "",
        f"Variants: {legend}. nbval --nbval-lax (worked examples exact, every assert must hold); seconds",
        "are nbval's per-notebook time on this 2-core machine, inflated when the machine is shared.",
        "",
        header,
        "|" + "---|" * (len(variants) + 2),
        *(rows[k] for k in sorted(rows)),
        END,
    ])
    if START in text:
        text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="default: every book/[0-9]*.ipynb")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help=f"default: {DEFAULT}")
    parser.add_argument("--workers", type=int, default=2, help="notebooks executed at a time")
    parser.add_argument("--timeout", type=int, default=300, help="nbval's per-cell timeout (s)")
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = parser.parse_args()
    notebooks = args.notebooks or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "book").glob("[0-9]*.ipynb"))
    variants = args.variant or DEFAULT
    results: dict[str, dict[str, tuple[list[str], float]]] = {nb: {} for nb in notebooks}
    for variant in variants:
        for notebook, outcome in run_variant(variant, notebooks, args.workers, args.timeout).items():
            results[notebook][variant] = outcome
    print(f"\n{'notebook':34} " + " ".join(f"{v:>24}" for v in variants))
    for notebook, by_variant in results.items():
        print(f"{notebook:34} " + " ".join(f"{describe(by_variant[v][0]):>24}" for v in variants))
    if args.write:
        write_table(variants, results)
    sys.exit(int(any(by_variant[v][0] for by_variant in results.values() for v in variants)))


if __name__ == "__main__":
    main()
