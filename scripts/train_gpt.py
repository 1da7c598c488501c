"""Train a small GPT on Python's documentation, on one process or on several with DDP.

One process (CPU or one GPU)::

    python scripts/train_gpt.py --steps 300

Several processes on one machine (gloo on CPUs, nccl with one GPU per process)::

    torchrun --standalone --nproc_per_node=4 scripts/train_gpt.py --steps 300

Several machines (run on each, node_rank 0..nnodes-1, same rendezvous address)::

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \\
        --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 scripts/train_gpt.py --steps 300

``--batch-size`` is the global batch: every rank trains on its own ``batch_size / world_size``
rows of the same global batch, and DDP averages the gradients, so the parameters follow the
single-process run on the same global batch (tests/test_gpt.py checks this on 2 CPU processes).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist

from lecture_pkg.bpe import ByteLevelBPE
from lecture_pkg.data import pydoc_topics
from lecture_pkg.models.gpt import GPT, GPTConfig, lm_batches, next_token_loss
from lecture_pkg.training import adamw, distributed_setup, train, warmup_cosine, wrap_ddp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-chars", type=int, default=None, help="use a prefix of the corpus")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="global, over all ranks")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--checkpoint", default=None, help="a .safetensors path; resumes from it")
    parser.add_argument("--save", default=None, help="write the final weights here (rank 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank, world_size, device = distributed_setup()
    text = pydoc_topics()[:args.max_chars]
    tokenizer = ByteLevelBPE().train(text, args.vocab_size)  # deterministic: same on every rank
    ids = torch.tensor(tokenizer.encode(text))
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=args.block_size,
                       n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                       dropout=args.dropout, embd_dropout=args.dropout)
    model = GPT(config).to(device)
    ddp_model = wrap_ddp(model, device)
    batches = lm_batches(train_ids, args.batch_size, args.block_size, args.seed, rank,
                         world_size)
    val_batch = lm_batches(val_ids, 64, args.block_size, seed=args.seed + 1)(0).to(device)

    def loss_fn(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        batch = batch.to(device)
        return next_token_loss(m(batch).logits, batch)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        loss = next_token_loss(model(val_batch).logits, val_batch).item()
        return {"val loss": loss, "val perplexity": math.exp(loss)}

    optimizer = adamw(model, args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  warmup_cosine(args.warmup, args.steps))
    history = train(ddp_model, batches, loss_fn, steps=args.steps, optimizer=optimizer,
                    scheduler=scheduler, clip_grad_norm=1.0,
                    autocast_dtype=torch.bfloat16 if args.bf16 else None, eval_fn=evaluate,
                    eval_every=max(1, args.steps // 5), log_every=max(1, args.steps // 20),
                    checkpoint=args.checkpoint, resume=args.checkpoint is not None)
    if rank == 0:
        print(f"{world_size} process(es) on {device}: final train loss "
              f"{history.losses[-1]:.4f}, {history.evals[-1]}")
        if args.save:
            from safetensors.torch import save_model

            save_model(model, args.save)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
