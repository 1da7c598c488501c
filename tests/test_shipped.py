"""The shipped-checkpoint reader: every checkpoint in the package has its JSON, loads with
safetensors as float32, and bad names are refused; every loader has one shape."""

import importlib
import inspect
import json
from importlib import resources

import pytest
import torch
from torch import nn

from lecture_pkg import char_tokenizers
from lecture_pkg.shipped import Shipped, save_shipped, shipped_info, shipped_state

NAMES = sorted(p.name.removesuffix(".safetensors")
               for p in (resources.files("lecture_pkg") / "checkpoints").iterdir()
               if p.name.endswith(".safetensors"))


def test_the_book_ships_its_checkpoints():
    assert {"shakespeare_gpt", "shakespeare_bert", "shakespeare_sft", "detr_shapes"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_checkpoint_has_facts_and_float32_tensors(name):
    assert isinstance(shipped_info(name), dict) and shipped_info(name)
    state = shipped_state(name)
    assert state and all(v.dtype == torch.float32 for v in state.values()
                         if v.is_floating_point())


@pytest.mark.parametrize("name", ["", "../pyproject", "a/b", ".hidden"])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="name"):
        shipped_info(name)


def test_a_missing_checkpoint_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        shipped_state("no_such_model")


def test_save_shipped_writes_what_the_readers_expect(tmp_path):
    from safetensors.torch import load_file

    state = {"w": torch.arange(6.0).reshape(2, 3).t().half(), "n": torch.tensor([1, 2])}
    save_shipped(tmp_path / "out", "toy", state, {"figures": {"loss": 1.5}})
    loaded = load_file(str(tmp_path / "out" / "toy.safetensors"))
    assert loaded.keys() == state.keys()
    assert loaded["w"].dtype == torch.float16 and torch.equal(loaded["w"], state["w"])
    assert torch.equal(loaded["n"], state["n"])
    text = (tmp_path / "out" / "toy.json").read_text()
    assert json.loads(text) == {"figures": {"loss": 1.5}} and text.endswith("\n")
    with pytest.raises(ValueError, match="name"):
        save_shipped(tmp_path, "../escape", state, {})


def test_provenance_records_a_runnable_command_and_the_commit(tmp_path):
    import shlex
    import subprocess
    from pathlib import Path

    from lecture_pkg.shipped import provenance

    script = Path(__file__).parent.parent / "scripts" / "train_gpt.py"
    record = provenance(script, ["--demo-separator", ": ", "--steps", "2"])
    assert shlex.split(record["command"]) == ["python", "scripts/train_gpt.py",
                                              "--demo-separator", ": ", "--steps", "2"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=script.parent)
    assert record["commit"] == (head.stdout.strip() if head.returncode == 0 else "")
    outside = tmp_path / "train_x.py"  # not in a git checkout
    assert provenance(outside, []) == {"command": "python scripts/train_x.py", "commit": ""}


LOADERS = {  # every shipped checkpoint: its loader, its info function, the tokenizer's class
    "shakespeare_gpt": ("shakespeare_gpt", "load_shakespeare_gpt", "shakespeare_gpt_info", "CharTokenizer"),
    "shakespeare_sft": ("shakespeare_gpt", "load_shakespeare_sft", "shakespeare_sft_info", "CharTokenizer"),
    "shakespeare_modern": ("shakespeare_gpt", "load_shakespeare_modern", "shakespeare_modern_info",
                           "CharTokenizer"),
    "shakespeare_bert": ("shakespeare_bert", "load_shakespeare_bert", "shakespeare_bert_info", "MLMChars"),
    "shakespeare_t5": ("shakespeare_t5", "load_shakespeare_t5", "shakespeare_t5_info", "ByteTokenizer"),
    "detr_shapes": ("detection", "load_shapes_detr", "shapes_detr_info", None),
}


def test_every_shipped_checkpoint_has_a_loader() -> None:
    few_shot = {"shakespeare_gpt_demos", "shakespeare_gpt_formats"}  # load_shakespeare_gpt(checkpoint=...)
    assert set(NAMES) == set(LOADERS) | few_shot


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_loader_has_one_shape(name: str) -> None:
    """load_<name>(device=None) -> Shipped(model, tokenizer): float32, eval mode, on the device
    asked for; <name>_info() -> the JSON beside the weights."""
    module_name, loader_name, info_name, tokenizer_class = LOADERS[name]
    module = importlib.import_module(f"lecture_pkg.{module_name}")
    loader, info = getattr(module, loader_name), getattr(module, info_name)
    parameters = inspect.signature(loader).parameters
    assert list(parameters)[0] == "device" and parameters["device"].default is None
    assert inspect.signature(info).return_annotation in ("dict[str, Any]", dict)
    loaded = loader(device="cpu")
    assert isinstance(loaded, Shipped) and isinstance(loaded.model, nn.Module)
    assert not loaded.model.training
    assert {(p.dtype, p.device.type) for p in loaded.model.parameters()} == {(torch.float32, "cpu")}
    if tokenizer_class is None:
        assert loaded.tokenizer is None
    else:
        assert isinstance(loaded.tokenizer, getattr(char_tokenizers, tokenizer_class))
    assert info() is shipped_info(name)
