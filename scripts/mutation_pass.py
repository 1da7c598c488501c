"""Mutation pass over the model stack (issue 25): plant one plausible bug at a time in a copy
of the package and check that the tests fail.

    .venv/bin/python scripts/mutation_pass.py [--dest /tmp/mut] [--only ID ...] [--own]

The working tree's ``lecture_pkg`` and ``tests`` are copied to ``--dest`` (the shared checkout
is never modified); each mutant replaces one exact snippet in the copy (it must occur exactly
once), runs the tests listed for it there with ``PYTHONPATH=<dest>``, and restores the file.
The new tests organised by kind of bug run first; when they do not fail, the module's own test
file runs too, so a mutant counts as killed when either fails. ``--own`` runs the module's
own tests for every mutant as well, to measure what they catch alone (slow: test_transformer
alone takes over a minute). Prints one line per mutant and the kill rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    kind: str
    file: str
    old: str
    new: str
    new_tests: tuple[str, ...]
    own_tests: tuple[str, ...]


MODE, INIT, WIRE, DECODE, TRAIN, TOL, LOAD, EDGE, BPE = (
    "training-mode dropout", "initialisation", "wiring", "decoding rule", "training",
    "tolerance", "strict loading", "boundary", "bpe tie rule")

T_MODE, T_INIT, T_WIRE, T_DEC, T_EDGE, T_LOAD = (
    "tests/test_training_mode.py", "tests/test_initialisation.py", "tests/test_wiring.py",
    "tests/test_decoding_rules.py", "tests/test_boundaries.py", "tests/test_strict_loading.py")

L, TR, G, GPT, COM, BERT, T5, VIT, SWIN, LORA, Q, TRAINING, BPEF = (
    "lecture_pkg/layers.py", "lecture_pkg/transformer.py", "lecture_pkg/generation.py",
    "lecture_pkg/models/gpt.py", "lecture_pkg/models/common.py", "lecture_pkg/models/bert.py",
    "lecture_pkg/models/t5.py", "lecture_pkg/models/vit.py", "lecture_pkg/models/swin.py",
    "lecture_pkg/lora.py", "lecture_pkg/quant.py", "lecture_pkg/training.py",
    "lecture_pkg/bpe.py")

OWN = {L: ("tests/test_layers.py",), TR: ("tests/test_transformer.py",),
       G: ("tests/test_generation.py",), GPT: ("tests/test_gpt.py",),
       COM: ("tests/test_bert.py", "tests/test_t5.py"), BERT: ("tests/test_bert.py",),
       T5: ("tests/test_t5.py",), VIT: ("tests/test_vit.py",), SWIN: ("tests/test_swin.py",),
       LORA: ("tests/test_lora.py",), Q: ("tests/test_quant.py",),
       TRAINING: ("tests/test_training.py",), BPEF: ("tests/test_bpe.py",)}


def m(id: str, kind: str, file: str, old: str, new: str, *tests: str) -> Mutant:
    return Mutant(id, kind, file, old, new, tests, OWN[file])


MUTANTS = [
    # ---- dropout placement in training mode
    m("pre-ln-dropout-on-sum", MODE, L, "return x + self.dropout(sublayer(self.norm(x)))",
      "return self.dropout(x + sublayer(self.norm(x)))", T_MODE, T_WIRE),
    m("post-ln-dropout-after-norm", MODE, L, "return self.norm(x + self.dropout(sublayer(x)))",
      "return self.dropout(self.norm(x + sublayer(x)))", T_MODE, T_WIRE),
    m("sandwich-dropout-inside", MODE, L,
      "return x + self.dropout(self.out_norm(sublayer(self.norm(x))))",
      "return x + self.out_norm(self.dropout(sublayer(self.norm(x))))", T_MODE, T_WIRE),
    m("lora-dropout-on-frozen-path", MODE, LORA, "y = self.base(x)",
      "y = self.base(self.dropout(x))", T_MODE, T_EDGE),
    m("lora-no-dropout-on-update", MODE, LORA, "F.linear(self.dropout(x).to(self.lora_A.dtype)",
      "F.linear(x.to(self.lora_A.dtype)", T_MODE),
    m("drop-path-no-rescale", MODE, SWIN, "return x * keep.to(x.dtype) / (1 - p)",
      "return x * keep.to(x.dtype)", T_MODE),
    m("drop-path-per-element", MODE, SWIN,
      "keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= p",
      "keep = torch.rand(x.shape, device=x.device) >= p", T_MODE),
    m("t5-no-embedding-dropout", MODE, T5,
      "        x = self.dropout(x)\n        self_weights, cross_weights = [], []",
      "        self_weights, cross_weights = [], []", T_MODE),
    m("t5-no-final-dropout", MODE, T5,
      "return self.dropout(self.final_norm(x)), self_weights, cross_weights",
      "return self.final_norm(x), self_weights, cross_weights", T_MODE),
    m("transformer-positions-not-dropped", MODE, TR, "return self.dropout(x + positions)",
      "return self.dropout(x) + positions", T_MODE, T_INIT),
    m("bert-dropout-before-norm", MODE, BERT, "return self.dropout(self.embed_norm(x))",
      "return self.embed_norm(self.dropout(x))", T_MODE, T_EDGE),
    m("gpt-positions-not-dropped", MODE, GPT,
      "x = self.drop(self.wte(input_ids) + self.wpe(position_ids))",
      "x = self.drop(self.wte(input_ids)) + self.wpe(position_ids)", T_MODE),
    m("vit-positions-not-dropped", MODE, VIT,
      "return self.drop(x if positions is None else x + positions)",
      "return self.drop(x) if positions is None else self.drop(x) + positions", T_MODE),
    # ---- initialisation statistics
    m("deepnet-beta-on-queries", INIT, L, "nn.init.xavier_normal_(module.q_proj.weight)",
      "nn.init.xavier_normal_(module.q_proj.weight, gain=beta)", T_INIT),
    m("deepnet-no-beta-on-out", INIT, L,
      "nn.init.xavier_normal_(module.out_proj.weight, gain=beta)",
      "nn.init.xavier_normal_(module.out_proj.weight)", T_INIT),
    m("deepnet-no-beta-on-ffn", INIT, L, "nn.init.xavier_normal_(linear.weight, gain=beta)",
      "nn.init.xavier_normal_(linear.weight)", T_INIT),
    m("transformer-embedding-std-1", INIT, TR,
      "nn.init.normal_(embedding.weight, std=self.d_model**-0.5)",
      "nn.init.normal_(embedding.weight, std=1.0)", T_INIT),
    m("transformer-untied-output-default-init", INIT, TR,
      "            nn.init.normal_(self.output.weight, std=self.d_model**-0.5)",
      "            pass", T_INIT),
    m("vit-positions-not-initialised", INIT, VIT,
      "nn.init.trunc_normal_(param, std=std)  # cls_token and the position tables",
      "pass  # cls_token and the position tables", T_INIT),
    m("gpt-residual-scaling-n-layer", INIT, GPT,
      "residual_std = std / math.sqrt(2 * self.config.n_layer)",
      "residual_std = std / math.sqrt(self.config.n_layer)", T_INIT),
    m("gpt-no-residual-scaling-on-ffn", INIT, GPT,
      "            nn.init.normal_(block.ffn.linear2.weight, mean=0.0, std=residual_std)\n",
      "", T_INIT),
    m("t5-query-without-d-kv", INIT, T5, "std=(cfg.d_model * d_kv) ** -0.5",
      "std=cfg.d_model ** -0.5", T_INIT),
    # ---- wiring with asymmetric weights
    m("sandwich-norms-swapped", WIRE, L,
      "return x + self.dropout(self.out_norm(sublayer(self.norm(x))))",
      "return x + self.dropout(self.norm(sublayer(self.out_norm(x))))", T_WIRE),
    m("encoder-blocks-swapped", WIRE, L,
      "x = self.attn_block(x, self_attention)\n        return self.ffn_block(x, self.ffn), weights",
      "x = self.ffn_block(x, self_attention)\n        return self.attn_block(x, self.ffn), weights",
      T_WIRE),
    # ---- decoding rules
    m("beam-accepts-eos-below-num-beams", DECODE, G, "if rank < beams:",
      "if rank < 2 * beams:", T_DEC),
    m("beam-stops-at-num-beams-finished", DECODE, G, "done[b] = best_open <= kth_best",
      "done[b] = True", T_DEC),
    m("beam-kth-best-is-the-best", DECODE, G,
      "kth_best = sorted(score for score, _ in finished[b])[-beams]",
      "kth_best = sorted(score for score, _ in finished[b])[-1]", T_DEC),
    m("beam-open-score-unnormalised", DECODE, G,
      "best_open = next_scores[b, 0].item() / penalty",
      "best_open = next_scores[b, 0].item()", T_DEC),
    m("beam-finished-unnormalised", DECODE, G,
      "finished[b].append((score / penalty, prefix + [token]))",
      "finished[b].append((score, prefix + [token]))", T_DEC),
    m("beam-length-without-stop-token", DECODE, G,
      "penalty = gnmt_length_penalty(length, length_penalty)",
      "penalty = gnmt_length_penalty(length - 1, length_penalty)", T_DEC),
    m("beam-out-of-length-no-penalty", DECODE, G,
      "penalty = gnmt_length_penalty(max_new_tokens, length_penalty)", "penalty = 1.0", T_DEC),
    m("beam-cache-not-reordered", DECODE, G,
      "            reorder_cache(cache, rows)", "            pass", T_DEC),
    m("gpt-beam-prompt-mask-tiled", DECODE, GPT,
      "prompt_mask.repeat_interleave(rows // batch, dim=0)",
      "prompt_mask.repeat(rows // batch, 1)", T_DEC),
    m("transformer-beam-memory-tiled", DECODE, TR,
      "memory = memory.repeat_interleave(num_beams, dim=0)",
      "memory = memory.repeat(num_beams, 1, 1)", T_DEC),
    m("transformer-beam-mask-tiled", DECODE, TR,
      "mask = None if mask is None else mask.repeat_interleave(num_beams, dim=0)",
      "mask = None if mask is None else mask.repeat(num_beams, 1)", T_DEC),
    # ---- training
    m("clip-max-norm", TRAIN, TRAINING,
      "nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)",
      "nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm, norm_type=float('inf'))",
      T_EDGE),
    m("ddp-loss-sum-over-ranks", TRAIN, TRAINING, "        value /= dist.get_world_size()\n",
      "", T_EDGE),
    m("ddp-loss-not-reduced", TRAIN, TRAINING,
      "history.losses.append(_mean_over_ranks(loss))", "history.losses.append(loss.item())",
      T_EDGE),
    m("checkpoint-betas-as-list", TRAIN, TRAINING,
      "tuple(v) if isinstance(current.get(k), tuple) else v", "v", "tests/test_training.py"),
    # ---- tolerances
    m("bert-embedding-norm-default-eps", TOL, BERT,
      "self.embed_norm = nn.LayerNorm(d, eps=config.eps, **factory)",
      "self.embed_norm = nn.LayerNorm(d, **factory)", T_EDGE),
    m("vit-final-norm-default-eps", TOL, VIT,
      "self.norm = nn.LayerNorm(d, eps=config.eps, **factory)",
      "self.norm = nn.LayerNorm(d, **factory)", T_EDGE),
    # ---- strict loading
    m("load-state-dict-not-strict", LOAD, COM, "self.load_state_dict(ours, strict=True)",
      "self.load_state_dict(ours, strict=False)", T_LOAD),
    m("rename-skips-unknown-names", LOAD, COM,
      "    if unknown:\n        raise ValueError(f\"weights with no counterpart",
      "    if False:\n        raise ValueError(f\"weights with no counterpart", T_LOAD),
    m("gpt-accepts-unknown-weights", LOAD, GPT,
      "        if unknown:\n            raise ValueError(f\"weights with no counterpart in this GPT",
      "        if False:\n            raise ValueError(f\"weights with no counterpart in this GPT",
      T_LOAD),
    # ---- untested paths and boundaries
    m("lm-loss-mask-shifted-wrong", EDGE, GPT, "~attention_mask[:, 1:].bool()",
      "~attention_mask[:, :-1].bool()", T_EDGE),
    m("lm-loss-ignores-mask", EDGE, GPT,
      "targets = targets.masked_fill(~attention_mask[:, 1:].bool(), -100)",
      "targets = targets.clone()", T_EDGE),
    m("count-4bit-weights-missing", EDGE, LORA,
      "    total += sum(m.in_features * m.out_features for m in model.modules()",
      "    total += 0 * sum(m.in_features * m.out_features for m in model.modules()", T_EDGE),
    m("int8-threshold-strict", EDGE, Q, "outliers = (x.abs() >= threshold).any(dim=0)",
      "outliers = (x.abs() > threshold).any(dim=0)", T_EDGE),
    m("zeropoint-range-without-zero", EDGE, Q,
      "lo, hi = x.amin().clamp(max=0), x.amax().clamp(min=0)", "lo, hi = x.amin(), x.amax()",
      T_EDGE),
    m("zeropoint-not-rounded", EDGE, Q, "zero_point = -128 - torch.round(scale * lo)",
      "zero_point = -128 - scale * lo", T_EDGE),
    # ---- BPE's tie rule
    m("bpe-greatest-becomes-smallest", BPE, BPEF, "return tuple(-b for b in data) + (1,)",
      "return tuple(data) + (-1,)", "tests/test_bpe.py"),
    m("bpe-recount-ignores-tie-rule", BPE, BPEF,
      "best = max(totals, key=lambda p: (totals[p], symbol_bytes(p[0]), symbol_bytes(p[1])))",
      "best = max(totals, key=totals.__getitem__)", "tests/test_bpe.py"),
    m("bpe-ties-by-str-not-bytes", BPE, BPEF,
      "iter_merges(words, list(pieces.values()), tie_break, _token_bytes)",
      "iter_merges(words, list(pieces.values()), tie_break, _utf8)", "tests/test_bpe.py"),
    m("bpe-train-drops-tie-break", BPE, BPEF,
      "merges = trainers[trainer](words, list(word_counts.values()), tie_break)",
      "merges = trainers[trainer](words, list(word_counts.values()))", "tests/test_bpe.py"),
]


def pytest(dest: Path, tests: tuple[str, ...], timeout: int, deselect: tuple[str, ...] = (),
           first_failure: bool = True) -> tuple[bool, float, str]:
    """(failed?, seconds, output) of running ``tests`` in ``dest`` on the copied package."""
    env = {**os.environ, "PYTHONPATH": str(dest), "OMP_NUM_THREADS": "1"}
    options = ["-x"] if first_failure else ["-rf"]
    options += [arg for node in deselect for arg in ("--deselect", node)]
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", *options, "-q", "-p",
                               "no:cacheprovider", *tests], cwd=dest, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, time.perf_counter() - start, "timeout (counted as killed)"
    return proc.returncode != 0, time.perf_counter() - start, proc.stdout


def last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path("/tmp/mut"))
    parser.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    parser.add_argument("--own", action="store_true", help="also run the module tests always")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args()
    dest: Path = args.dest
    if dest.resolve() == ROOT:
        raise SystemExit("--dest must not be the repository itself")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("lecture_pkg", "tests", "scripts"):
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml",):
        shutil.copy(ROOT / name, dest / name)
    check = subprocess.run([sys.executable, "-c", "import lecture_pkg; print(lecture_pkg.__file__)"],
                           cwd=dest, env={**os.environ, "PYTHONPATH": str(dest)},
                           capture_output=True, text=True)
    assert check.stdout.strip().startswith(str(dest)), f"imports {check.stdout!r}, not the copy"

    mutants = [mu for mu in MUTANTS if not args.only or mu.id in args.only]
    # Baseline: tests that already fail on the unmutated copy (another engineer's work in
    # progress, a missing tool) would kill every mutant; they are deselected and reported.
    files = sorted({t for mu in mutants for t in (*mu.new_tests, *mu.own_tests)})
    failed, seconds, output = pytest(dest, tuple(files), args.timeout, first_failure=False)
    broken = tuple(line.split()[1] for line in output.splitlines() if line.startswith("FAILED "))
    print(f"baseline: {len(files)} test files in {seconds:.0f} s, {last_line(output)}")
    for node in broken:
        print(f"  deselected (fails without any mutant): {node}")
    if failed and not broken:
        raise SystemExit("the unmutated copy fails its tests:\n" + output[-3000:])
    results = []
    for mu in mutants:
        path = dest / mu.file
        original = path.read_text()
        if original.count(mu.old) != 1:
            print(f"SKIP  {mu.id:42s} snippet found {original.count(mu.old)} times", flush=True)
            results.append((mu, "skipped"))
            continue
        mutated = original.replace(mu.old, mu.new)
        try:
            compile(mutated, str(path), "exec")
        except SyntaxError as error:  # a mutant must be a program, not a collection error
            print(f"INVALID {mu.id:42s} {error}", flush=True)
            results.append((mu, "skipped"))
            continue
        path.write_text(mutated)
        try:
            killed, seconds, last = pytest(dest, mu.new_tests, args.timeout, broken)
            verdict = "new" if killed else ""
            if args.own or not killed:
                own_killed, own_seconds, own_last = pytest(dest, mu.own_tests, args.timeout,
                                                           broken)
                seconds += own_seconds
                verdict = (verdict + "+own" if verdict else "own") if own_killed else verdict
                last = last if killed else own_last
            verdict = verdict or "SURVIVED"
        finally:
            path.write_text(original)
        results.append((mu, verdict))
        print(f"{verdict:8s} {mu.id:42s} [{mu.kind}] {seconds:5.1f} s  {last_line(last)[-60:]}",
              flush=True)

    ran = [(mu, v) for mu, v in results if v != "skipped"]
    killed = [mu for mu, v in ran if v != "SURVIVED"]
    by_new = [mu for mu, v in ran if v.startswith("new")]
    print(f"\n{len(killed)}/{len(ran)} mutants killed ({100 * len(killed) / max(len(ran), 1):.0f} %); "
          f"{len(by_new)} by the new tests; skipped {len(results) - len(ran)}")
    if args.own:
        by_own = [mu for mu, v in ran if "own" in v]
        print(f"module tests alone: {len(by_own)}/{len(ran)}")
    for mu, v in ran:
        if v == "SURVIVED":
            print(f"survivor: {mu.id} ({mu.file})")


if __name__ == "__main__":
    main()
