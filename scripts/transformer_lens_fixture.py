"""Write ``tests/data/transformer_lens_gpt2.{safetensors,json}``: a tiny random GPT-2 and the
scores TransformerLens (Nanda et al.) computes for it, against which
``tests/test_interpretability_tl.py`` checks :mod:`lecture_pkg.interpretability` without
installing TransformerLens.

TransformerLens is not a dependency of the book; run this script in a throwaway environment::

    python3 -m venv /tmp/tlvenv
    /tmp/tlvenv/bin/pip install torch==2.13.0 transformer_lens safetensors
    /tmp/tlvenv/bin/python scripts/transformer_lens_fixture.py

What it stores, for a (2, 32) batch of tokens with a repeated half:

- ``induction``: TransformerLens's ``detect_head`` score for ``"induction_head"``
  (error measure ``"mul"``: the share of all attention on the keys after an earlier occurrence
  of the query's token, averaged over every query and row);
- ``dla``: the direct logit attribution of each head (``stack_head_results`` then
  ``logit_attrs``, the final LayerNorm's scale frozen at its value in the run) to the
  difference logit(next token) - logit(token 0), at every position, in compatibility mode
  (HookedTransformer's weight processing) with the value biases left in the heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models
from transformer_lens.head_detector import get_induction_head_detection_pattern
from transformer_lens.model_bridge import TransformerBridge
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"


def tiny_gpt2() -> GPT2LMHeadModel:
    """A 2-layer, 4-head GPT-2 of width 32 over 48 tokens; LayerNorm gains and biases drawn at
    random so that no part of the decomposition is trivially zero."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=48, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == \
                    "transformer.ln_f.weight":
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("c_attn.weight"):
                p.mul_(20.0)  # sharper patterns than GPT-2's 0.02 initialisation gives
    return model


def main() -> None:
    hf = tiny_gpt2()
    generator = torch.Generator().manual_seed(1)
    half = torch.randint(48, (2, 16), generator=generator)
    tokens = torch.cat([half, half], dim=1)  # (2, 32)
    # parameters only (no buffers); the tied unembedding appears once, as the embedding
    weights = {k: v.detach().clone() for k, v in hf.named_parameters()}
    with torch.no_grad():
        hf_logits = hf(tokens).logits
    # a word-level tokenizer over 48 made-up words: the bridge wants one, no download needed
    vocab = {f"w{i}": i for i in range(48)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w0")),
        bos_token="w0", eos_token="w0", unk_token="w0", pad_token="w0", add_bos_token=True)
    tokenizer.init_kwargs["name_or_path"] = "made-up"  # the bridge reads it, loads nothing
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, device="cpu",
                                                 tokenizer=tokenizer)
    # HookedTransformer's numerics: the final LayerNorm's gain folded into W_U, so that
    # logit_attrs reads (x - mean) / sigma * g @ W_U (the bias and W_U's centring drop out of
    # a logit difference). The value biases stay in the heads, where the package counts them
    # (folded, they would move to the output projection's bias)
    bridge.enable_compatibility_mode(fold_value_biases=False)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)
    # compatibility mode centres W_U: the logits move by a constant per position, the
    # log-probabilities do not
    gap = float((logits.log_softmax(-1) - hf_logits.log_softmax(-1)).abs().max())
    patterns = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(2)])
    detection = torch.stack([get_induction_head_detection_pattern(row) for row in tokens])
    # detect_head's "mul" score, computed from its own detection pattern and the bridge's
    # patterns: sum(pattern * detection) / sum(pattern), then averaged over the rows
    induction = ((patterns * detection[None, :, None]).sum((-1, -2))
                 / patterns.sum((-1, -2))).mean(1)
    with torch.no_grad():
        stack, labels = cache.stack_head_results(return_labels=True)
    target = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    with torch.no_grad():
        dla = cache.logit_attrs(stack, tokens=target, incorrect_tokens=torch.zeros_like(target))
    OUT.mkdir(exist_ok=True)
    save_file(weights, str(OUT / "transformer_lens_gpt2.safetensors"))
    record = {"config": {k: hf.config.to_dict()[k] for k in
                         ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")},
              "tokens": tokens.tolist(), "targets": target.tolist(), "labels": labels,
              "bridge_vs_hf_max_gap": gap, "induction": induction.tolist(),
              "dla": dla.tolist(),
              "transformer_lens": __import__("importlib.metadata").metadata.version(
                  "transformer_lens"), "torch": torch.__version__}
    (OUT / "transformer_lens_gpt2.json").write_text(json.dumps(record) + "\n")
    print(f"bridge vs HF log-probabilities: {gap:.1e}; induction scores {induction.tolist()}")


if __name__ == "__main__":
    main()
