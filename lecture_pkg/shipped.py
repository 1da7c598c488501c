"""Weights shipped inside the package, in ``lecture_pkg/checkpoints/``.

Each checkpoint is a pair: ``<name>.safetensors`` (the tensors, float16 where that loses nothing
the book measures) and ``<name>.json`` (the facts about it: configuration, vocabulary, how it
was trained, its recorded held-out figures). The loaders of the individual models read both
through here, with safetensors only, so no pickled code is ever run. Every loader has one shape:
``load_<name>(device=None) -> Shipped(model, tokenizer)``, the model in float32 and eval mode on
``device`` (default CPU), beside an info function ``<name>_info()`` returning the JSON:

* :mod:`lecture_pkg.shakespeare_gpt`: ``load_shakespeare_gpt`` (three checkpoints) and
  ``load_shakespeare_sft``;
* :mod:`lecture_pkg.shakespeare_bert`: ``load_shakespeare_bert``;
* :mod:`lecture_pkg.shakespeare_t5`: ``load_shakespeare_t5``;
* :mod:`lecture_pkg.detection`: ``load_shapes_detr`` (tokenizer ``None``: it reads pixels).
"""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn


class Shipped(NamedTuple):
    """What every loader of a shipped checkpoint returns: the model (float32, eval mode) and
    its tokenizer (a :mod:`lecture_pkg.char_tokenizers` class; ``None`` for a vision model)."""

    model: nn.Module
    tokenizer: Any


def _check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"name must be a checkpoint's bare name, got {name!r}")


def _path(name: str, suffix: str):
    _check_name(name)
    path = resources.files("lecture_pkg") / "checkpoints" / f"{name}.{suffix}"
    if not path.is_file():
        raise FileNotFoundError(f"no shipped checkpoint file {name}.{suffix} in "
                                "lecture_pkg/checkpoints")
    return path


@functools.cache
def shipped_info(name: str) -> dict[str, Any]:
    """The JSON stored beside the weights of checkpoint ``name``. Cached: treat it as read-only."""
    return json.loads(_path(name, "json").read_text(encoding="utf-8"))


def shipped_state(name: str) -> dict[str, Tensor]:
    """The tensors of checkpoint ``name`` as float32 (integer tensors keep their dtype)."""
    from safetensors.torch import load

    state = load(_path(name, "safetensors").read_bytes())
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def save_shipped(folder: str | Path, name: str, state: dict[str, Tensor],
                 info: dict[str, Any]) -> None:
    """Write checkpoint ``name`` into ``folder`` (created if missing): ``state`` as safetensors
    (moved to the CPU, made contiguous, dtypes kept: cast to float16 before calling to ship
    half precision) and ``info`` as indented JSON. The scripts in ``scripts/`` write the
    shipped checkpoints with it; :func:`shipped_state` and :func:`shipped_info` read them."""
    from safetensors.torch import save_file

    _check_name(name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
              str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def provenance(script: str | Path, argv: Sequence[str] | None = None) -> dict[str, str]:
    """How a training script ran, for its checkpoint's JSON: ``command``, a line that runs it
    again (``python scripts/<file>`` and its arguments, shell-quoted; ``argv`` defaults to
    ``sys.argv[1:]``), and ``commit``, the short hash of HEAD of the checkout holding
    ``script`` ("" outside a git checkout)."""
    script = Path(script)
    args = sys.argv[1:] if argv is None else list(argv)
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=script.parent)
    return {"command": shlex.join(["python", f"scripts/{script.name}", *args]),
            "commit": run.stdout.strip() if run.returncode == 0 else ""}
