"""Export the book's Shakespeare GPT to ONNX for the live page (book/text/07e_live_gpt.md).

    python scripts/export_live_gpt.py            # writes book/live_gpt/shakespeare_gpt.onnx + .json

The graph takes ``input_ids`` (1, t) int64, 1 <= t <= n_positions, and returns

- ``logits`` (1, t, vocab): next-character logits at every position;
- ``attentions`` (n_layer, n_head, t, t): every head's attention weights (rows sum to 1);
- ``lens`` (n_layer, vocab): the logit lens at the last position, the residual stream after each
  block read through the final LayerNorm and the tied output layer (the last row is the logits).

The shipped weights are float16 (lecture_pkg.shakespeare_gpt); PyTorch loads them into float32. The
export stores them as float16 initializers, each followed by a Cast to float32, so the file is
half the size of a float32 export and computes with exactly the weights PyTorch uses.

The JSON beside it holds the vocabulary (``chars`` then ``special_tokens``), the context length
and the layer and head counts. Both files are served by the built book (book/_ext/offline_js.py
copies book/live_gpt/ to _build/html/_static/live_gpt/). tests/test_live_gpt.py checks the
shipped file against PyTorch with onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lecture_pkg.models.gpt import GPT  # noqa: E402
from lecture_pkg.shakespeare_gpt import load_shakespeare_gpt, shakespeare_gpt_info  # noqa: E402

OUT = ROOT / "book" / "live_gpt"


class LiveGPT(nn.Module):
    """GPT's forward for one unpadded prompt, returning logits, attentions and the logit lens.

    The blocks' own residual wiring, norms and feed-forward layers are reused; attention is
    written out here (the package's checks want Python ints for the prompt length, which the
    ONNX tracer turns into tensors so that one graph serves every length)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt

    @staticmethod
    def _attention(mha: nn.Module, h: Tensor) -> tuple[Tensor, Tensor]:
        """Causal multi-head self-attention of h (1, t, d): output (1, t, d), weights (heads, t, t)."""
        t = h.shape[1]
        heads = [proj(h).view(1, t, mha.num_heads, -1).transpose(1, 2)
                 for proj in (mha.q_proj, mha.k_proj, mha.v_proj)]
        q, k, v = heads
        scale = mha.scale if mha.scale is not None else 1 / math.sqrt(mha.embed_dim // mha.num_heads)
        scores = q @ k.transpose(-2, -1) * scale
        allowed = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        weights = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(1, t, -1)
        return mha.out_proj(out), weights[0]

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        gpt = self.gpt
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = gpt.wte(input_ids) + gpt.wpe(positions)
        attentions, lens = [], []
        for block in gpt.blocks:
            store: list[Tensor] = []

            def attend(h: Tensor, mha: nn.Module = block.self_attn, store: list = store) -> Tensor:
                out, weights = self._attention(mha, h)
                store.append(weights)
                return out

            x = block.ffn_block(block.attn_block(x, attend), block.ffn)
            attentions.append(store[0])
            lens.append(gpt.lm_head(gpt.ln_f(x[0, -1])))
        return gpt.lm_head(gpt.ln_f(x)), torch.stack(attentions), torch.stack(lens)


def _store_weights_as_float16(path: Path) -> None:
    """Rewrite every float32 initializer that float16 holds exactly as float16 + Cast."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    kept, casts = [], []
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        half = array.astype(np.float16)
        if array.dtype != np.float32 or array.size < 64 or not np.array_equal(half.astype(np.float32), array):
            kept.append(init)
            continue
        stored = numpy_helper.from_array(half, init.name + "_f16")
        kept.append(stored)
        casts.append(helper.make_node("Cast", [stored.name], [init.name], to=onnx.TensorProto.FLOAT,
                                      name="cast_" + init.name))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def export(out_dir: Path = OUT) -> tuple[Path, Path]:
    model, tokenizer = load_shakespeare_gpt()
    info = shakespeare_gpt_info()
    wrapper = LiveGPT(model).eval()
    example = torch.tensor([tokenizer.encode("ROMEO:\nBut soft")])
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, json_path = out_dir / "shakespeare_gpt.onnx", out_dir / "shakespeare_gpt.json"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter: see LiveGPT
        torch.onnx.export(wrapper, (example,), str(onnx_path), input_names=["input_ids"],
                          output_names=["logits", "attentions", "lens"], opset_version=17,
                          dynamic_axes={"input_ids": {1: "t"}, "logits": {1: "t"},
                                        "attentions": {2: "t", 3: "t"}},
                          dynamo=False)
    _store_weights_as_float16(onnx_path)
    config = info["config"]
    json_path.write_text(json.dumps({
        "chars": info["chars"], "special_tokens": info["special_tokens"],
        "n_positions": config["n_positions"], "n_layer": config["n_layer"], "n_head": config["n_head"],
        "checkpoint": "lecture_pkg/checkpoints/shakespeare_gpt.safetensors",
    }, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return onnx_path, json_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the .onnx and .json")
    args = parser.parse_args()
    onnx_path, json_path = export(args.out)
    print(f"{onnx_path}: {onnx_path.stat().st_size / 1e6:.2f} MB; {json_path}")


if __name__ == "__main__":
    main()
