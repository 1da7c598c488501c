"""Train a character-level GPT on Shakespeare (the book's reference GPT), on one process or on
several with DDP.

The book's checkpoint (``lecture_pkg/checkpoints/shakespeare_gpt.*``), on one CPU thread::

    OMP_NUM_THREADS=1 python scripts/train_gpt.py --n-layer 4 --n-embd 128 --n-head 4 \\
        --block-size 128 --batch-size 32 --steps 7000 --lr 3e-3 --warmup 200 \\
        --eval-every 500 --export lecture_pkg/checkpoints

(about 52 minutes on one thread; ``make checkpoint`` runs it).

Chapter 10's few-shot model continues that checkpoint with a quarter of every batch replaced by
demonstration lists (:func:`lecture_pkg.shakespeare_tasks.demonstration_windows`)::

    OMP_NUM_THREADS=1 python scripts/train_gpt.py --init shakespeare_gpt --demo-share 0.25 \\
        --name shakespeare_gpt_demos --batch-size 32 --steps 2000 --lr 1e-3 --warmup 100 \\
        --eval-every 400 --export lecture_pkg/checkpoints

(``make checkpoint-demos``). Its JSON also records few-shot accuracies on the held-out words.
``make checkpoint-formats`` runs the same recipe with seven separators in place of ``": "``
(``--demo-separator`` once per separator; each window draws one).

Chapter 7.4's modern decoder (``--arch modern``: :class:`lecture_pkg.models.llama.Llama` with
RoPE, RMSNorm, SwiGLU at width 8d/3, no biases, an untied output layer) is trained by the same
recipe as the reference GPT, the architecture the only change (``make checkpoint-modern``)::

    OMP_NUM_THREADS=1 python scripts/train_gpt.py --arch modern --name shakespeare_modern \
        --n-layer 4 --n-embd 128 --n-head 4 --block-size 128 --batch-size 32 --steps 7000 \
        --lr 3e-3 --warmup 200 --eval-every 500 --export lecture_pkg/checkpoints

Every evaluation overwrites the export; the shipped files are the final export, whose step the
JSON records (``figures["steps"]``).

Several processes on one machine (gloo on CPUs, nccl with one GPU per process)::

    torchrun --standalone --nproc_per_node=4 scripts/train_gpt.py --steps 300

``--batch-size`` is the global batch: every rank trains on its own ``batch_size / world_size``
rows of the same global batch, and DDP averages the gradients, so the parameters follow the
single-process run on the same global batch (tests/test_gpt.py checks this on 2 CPU processes).

The vocabulary is every character of the 34 training works plus the special tokens of
:data:`lecture_pkg.char_tokenizers.SPECIAL_TOKENS` (the validation and test works use no other
character). Training reads the training works; the validation works give the curve, the test
works the recorded figures, measured once, after the last step. ``--export DIR`` writes
``shakespeare_gpt.safetensors`` (float16) and ``shakespeare_gpt.json`` at every evaluation
(validation figures only), so the latest export is always usable, and once more at the end with
the test figures.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.data import shakespeare
from lecture_pkg.lm_eval import eval_starts, nats_per_char
from lecture_pkg.models.gpt import GPT, GPTConfig, lm_batches, next_token_loss
from lecture_pkg.models.llama import Llama, LlamaConfig
from lecture_pkg.shakespeare_gpt import CHECKPOINT, load_gpt_weights
from lecture_pkg.shakespeare_tasks import SPELLINGS, demonstration_windows, spelling_accuracy, spelling_words
from lecture_pkg.shipped import provenance, save_shipped, shipped_info
from lecture_pkg.training import adamw, distributed_setup, train, warmup_cosine, wrap_ddp

EVAL_WINDOWS = 64  # validation windows per evaluation during training
TEST_WINDOWS = 256  # the recorded held-out figure
CHECK_WINDOWS = 16  # the small slice a unit test re-evaluates
SHOTS = (0, 1, 4)  # few-shot figures recorded for a --demo-share model
SPELLING_QUERIES = 64  # queries per spelling and number of shots (seed 0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-chars", type=int, default=None,
                        help="use a prefix of the training text")
    parser.add_argument("--arch", choices=("gpt", "modern"), default="gpt",
                        help="gpt: the book's GPT-2-style model; modern: chapter 7.4's Llama")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="global, over all ranks")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=None,
                        help="default: steps // 5")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--checkpoint", default=None, help="a .safetensors path; resumes from it")
    parser.add_argument("--save", default=None, help="write the final weights here (rank 0)")
    parser.add_argument("--export", default=None,
                        help="a folder for the packaged float16 checkpoint and its JSON")
    parser.add_argument("--name", default=CHECKPOINT, help="the exported checkpoint's name")
    parser.add_argument("--init", default=None,
                        help="start from this shipped checkpoint (its configuration wins)")
    parser.add_argument("--demo-share", type=float, default=0.0,
                        help="share of each batch's rows that are demonstration lists")
    parser.add_argument("--demo-separator", action="append", default=None,
                        help="a separator between word and answer in the demonstration lists "
                             "(repeat for several; default ': ')")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, vocab_size: int) -> GPT | Llama:
    """The GPT of ``--arch gpt``, or the modern decoder of the same depth, width and heads
    (SwiGLU at width 8d/3 for about the parameters of GELU at 4d)."""
    if args.arch == "modern":
        return Llama(LlamaConfig(vocab_size=vocab_size, hidden_size=args.n_embd,
                                 intermediate_size=8 * args.n_embd // 3,
                                 num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                                 max_position_embeddings=args.block_size))
    return GPT(GPTConfig(vocab_size=vocab_size, n_positions=args.block_size, n_embd=args.n_embd,
                         n_layer=args.n_layer, n_head=args.n_head, dropout=args.dropout,
                         embd_dropout=args.dropout))


def export(model: GPT | Llama, tokenizer: CharTokenizer, folder: Path, checkpoint: str,
           figures: dict, history: dict, spellings: bool, test: bool = False) -> float | None:
    """Write the float16 weights and the JSON. With ``test`` (the final export only) the float16
    model is also scored on the test works and the few-shot words, and the test figure is
    returned; otherwise the figures hold validation only and None is returned."""
    tied = isinstance(model, GPT)  # the GPT's lm_head.weight is wte.weight, stored once
    state = {k: v.detach().cpu().half().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    reloaded = type(model)(model.config)
    full = {k: v.float() for k, v in state.items()}
    if tied:
        full["lm_head.weight"] = full["wte.weight"]
    reloaded.load_state_dict(full)
    reloaded.eval()
    test_ids = torch.tensor(tokenizer.encode(shakespeare("test")))
    block = model.context_length
    for name, windows in (("test", TEST_WINDOWS), ("check", CHECK_WINDOWS)) if test else ():
        starts = eval_starts(len(test_ids), windows, block)
        figures[f"{name}_slice"] = {"split": "test", "windows": windows, "length": block,
                                    "nats_per_char": nats_per_char(reloaded, test_ids, starts,
                                                                   block)}
    if spellings and test:  # held-out few-shot accuracy, recorded for the test to reproduce
        words = spelling_words("test")
        figures["spelling_accuracy"] = {
            "queries": SPELLING_QUERIES, "seed": 0, "words": "test",
            "shots": {k: {s: spelling_accuracy(reloaded, tokenizer, words, s, k, 0,
                                               SPELLING_QUERIES) for s in SPELLINGS}
                      for k in SHOTS}}
    info = {"arch": "modern" if isinstance(model, Llama) else "gpt",
            "config": asdict(model.config), "chars": tokenizer.chars,
            "special_tokens": list(tokenizer.special_tokens), "figures": figures,
            "history": history}
    save_shipped(folder, checkpoint, state, info)
    return figures["test_slice"]["nats_per_char"] if test else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not 0.0 <= args.demo_share <= 1.0:
        raise ValueError(f"--demo-share must be in [0, 1], got {args.demo_share}")
    rank, world_size, device = distributed_setup()
    tokenizer = CharTokenizer.from_text(shakespeare("train"))
    train_ids = torch.tensor(tokenizer.encode(shakespeare("train")[:args.max_chars]))
    val_ids = torch.tensor(tokenizer.encode(shakespeare("validation")))

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    if args.init:
        if args.arch != "gpt":
            raise ValueError("--init continues a shipped GPT; it needs --arch gpt")
        info = shipped_info(args.init)
        if info["chars"] != tokenizer.chars:
            raise ValueError(f"--init {args.init} has another vocabulary")
        model = GPT(GPTConfig(**info["config"]))
        args.block_size = model.context_length
        load_gpt_weights(model, args.init)
    else:
        model = build_model(args, tokenizer.vocab_size)
    model = model.to(device)
    val_starts = eval_starts(len(val_ids), EVAL_WINDOWS, args.block_size)
    ddp_model = wrap_ddp(model, device)
    text_batches = lm_batches(train_ids, args.batch_size, args.block_size, args.seed, rank,
                              world_size)
    demo_rows = round(args.demo_share * (args.batch_size // world_size))  # per rank
    words = spelling_words("train")
    separators = tuple(args.demo_separator or (": ",))

    def batches(step: int) -> torch.Tensor:
        """Text windows, the first ``demo_rows`` rows replaced by demonstration lists."""
        batch = text_batches(step)
        if demo_rows:
            rng = random.Random((args.seed * 1_000_003 + step) * world_size + rank)
            batch[:demo_rows] = demonstration_windows(words, tokenizer.encode, demo_rows,
                                                      args.block_size, rng, separators)
        return batch
    began = time.perf_counter()
    run = provenance(__file__, argv)
    curve: dict[str, list] = {"steps": [], "val_nats_per_char": []}
    last: dict[str, dict] = {}  # the figures of the latest export

    def loss_fn(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        batch = batch.to(device)
        return next_token_loss(m(batch).logits, batch)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        loss = nats_per_char(model, val_ids, val_starts, args.block_size)
        if args.export and rank == 0:
            curve["steps"].append(min((len(curve["steps"]) + 1) * eval_every, args.steps))
            curve["val_nats_per_char"].append(loss)
            figures = {"steps": curve["steps"][-1], "params": sum(
                p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
                "train_seconds": round(time.perf_counter() - began, 1), **run,
                "val_nats_per_char": loss}
            export(model, tokenizer, Path(args.export), args.name, figures, curve,
                   spellings=args.demo_share > 0)
            last["figures"] = figures
            print(f"step {curve['steps'][-1]}: val {loss:.4f} nats/char, "
                  f"{figures['train_seconds']} s", flush=True)
        return {"val nats/char": loss}

    eval_every = args.eval_every or max(1, args.steps // 5)
    optimizer = adamw(model, args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  warmup_cosine(args.warmup, args.steps))
    history = train(ddp_model, batches, loss_fn, steps=args.steps, optimizer=optimizer,
                    scheduler=scheduler, clip_grad_norm=1.0,
                    autocast_dtype=torch.bfloat16 if args.bf16 else None, eval_fn=evaluate,
                    eval_every=eval_every, log_every=max(1, args.steps // 20),
                    checkpoint=args.checkpoint, resume=args.checkpoint is not None,
                    progress=rank == 0 and args.export is None)
    if rank == 0:
        print(f"{world_size} process(es) on {device}: final train loss "
              f"{history.losses[-1]:.4f}, {history.evals[-1]}")
        if args.export:  # the test works, once, on the final weights (train()
            # evaluates after the last step, so last["figures"] describe them)
            test = export(model, tokenizer, Path(args.export), args.name, last["figures"],
                          curve, spellings=args.demo_share > 0, test=True)
            print(f"test {test:.4f} nats/char (measured once)", flush=True)
        if args.save:
            from safetensors.torch import save_model

            save_model(model, args.save)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
