"""BPE training and encoding: lecture_pkg.bpe against its recount reference and HF tokenizers.

Run from the repository root: .venv/bin/python benchmarks/bpe.py [--merges 2000] [--skip-recount]

Corpus: the standard library's docstrings (lecture_pkg.data.stdlib_docstrings, about 1.7 MB on
CPython 3.11) for training; Python's pydoc topics (about 0.47 MB) as unseen text for encoding.
Every ratio is taken within this one run. Times are wall-clock seconds from
lecture_pkg.measure.wall_time, the best of --repeats runs (the best run is the one least disturbed
by other processes on a shared machine). HF tokenizers runs on one thread (its Rust thread pool is
switched off through TOKENIZERS_PARALLELISM/RAYON_NUM_THREADS before it is imported).

Tables:
1. classic BPE: learn_bpe (incremental) vs learn_bpe(trainer="recount") vs HF's BpeTrainer with
   an end-of-word suffix, the same number of merges;
2. byte-level BPE: ByteLevelBPE.train vs HF's BpeTrainer on ByteLevel pre-tokens, same vocabulary
   size;
3. encoding throughput of ByteLevelBPE (cold and warm pre-token cache, one call and line by line)
   vs HF single-thread on the same merges (our export): cold (a freshly loaded tokenizer, empty
   word cache) and warm, one call on the whole text and encode_batch over its lines, and each
   side's pre-tokenization alone (where most of the time goes); plus HF on its own merges.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"   # must precede the import of tokenizers
os.environ["RAYON_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import TypeVar  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from lecture_pkg.bpe import ByteLevelBPE, learn_bpe, pretokenize, word_counts  # noqa: E402
from lecture_pkg.data import pydoc_topics, stdlib_docstrings  # noqa: E402
from lecture_pkg.measure import wall_time  # noqa: E402

T = TypeVar("T")


def best_time(fn: Callable[[], T], repeats: int, warmup: int = 0) -> tuple[float, T]:
    """Best wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs, and the
    result of the last run (training runs need no warm-up: each one starts from scratch)."""
    results: list[T] = []
    seconds = wall_time(lambda: results.append(fn()), repeats=repeats, warmup=warmup)
    return seconds, results[-1]


def hf_classic(text: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()   # \w+|[^\w\s]+, as word_counts
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  end_of_word_suffix="</w>")
    tok.train_from_iterator([text], trainer)
    return tok


def hf_byte_level(text: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


def n_merges(tok: Tokenizer) -> int:
    return len(json.loads(tok.to_str())["model"]["merges"])


def table(title: str, header: tuple[str, ...], rows: list[tuple]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--merges", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-recount", action="store_true", help="skip the slow reference trainer")
    args = parser.parse_args()

    text, unseen = stdlib_docstrings(), pydoc_topics()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs; training corpus "
          f"{len(text.encode()) / 1e6:.2f} MB, unseen text {len(unseen.encode()) / 1e6:.2f} MB, "
          f"{args.merges} merges, best of {args.repeats}")

    # 1. classic BPE ------------------------------------------------------------------------
    t_count, wc = best_time(lambda: word_counts(text), args.repeats)
    t_fast, merges = best_time(lambda: learn_bpe(wc, args.merges), args.repeats)
    alphabet = {c for w in wc for c in w} | {w[-1] + "</w>" for w in wc}   # HF glues </w> to the last letter
    t_hf, hf = best_time(lambda: hf_classic(text, len(alphabet) + args.merges), args.repeats)
    rows = [("learn_bpe (incremental)", f"{t_fast:.2f}", "1.0", len(merges)),
            ("word_counts + learn_bpe", f"{t_count + t_fast:.2f}", f"{(t_count + t_fast) / t_fast:.2f}", len(merges)),
            ("HF BpeTrainer (from raw text, 1 thread)", f"{t_hf:.2f}", f"{t_hf / t_fast:.2f}", n_merges(hf))]
    if not args.skip_recount:
        t_slow, slow = best_time(lambda: learn_bpe(wc, args.merges, trainer="recount"), 1)
        assert slow == merges, "the two trainers disagree"
        rows.insert(1, ("learn_bpe(trainer='recount') (1 run)", f"{t_slow:.2f}", f"{t_slow / t_fast:.1f}", len(slow)))
    table(f"Classic BPE training, {len(wc)} distinct words, {sum(wc.values())} running words",
          ("trainer", "seconds", "time / incremental", "merges"), rows)

    # 2. byte-level BPE ---------------------------------------------------------------------
    vocab_size = 256 + args.merges
    t_ours, ours = best_time(lambda: ByteLevelBPE().train(text, vocab_size), args.repeats)
    t_hf, hf = best_time(lambda: hf_byte_level(text, vocab_size), args.repeats)
    table(f"Byte-level BPE training to vocab_size {vocab_size}", ("trainer", "seconds", "time / HF"),
          [("ByteLevelBPE.train", f"{t_ours:.2f}", f"{t_ours / t_hf:.2f}"),
           ("HF BpeTrainer + ByteLevel (1 thread)", f"{t_hf:.2f}", "1.00")])

    # 3. encoding ---------------------------------------------------------------------------
    mb = len(unseen.encode()) / 1e6
    lines = unseen.splitlines(keepends=True)
    exported = ours.to_hf_tokenizer()

    def hf_cold(call: Callable[[Tokenizer], object]) -> float:
        """Best of --repeats runs, each on a freshly loaded export (HF's word cache empty)."""
        runs = []
        for _ in range(args.repeats):
            fresh = Tokenizer.from_str(exported.to_str())
            runs.append(wall_time(lambda: call(fresh), repeats=1, warmup=0))
        return min(runs)

    t_cold, ids = best_time(lambda: ByteLevelBPE(ours.merges).encode(unseen), args.repeats)
    t_warm, _ = best_time(lambda: ours.encode(unseen), args.repeats, warmup=1)
    t_lines, _ = best_time(lambda: [e for b in [ByteLevelBPE(ours.merges)] for e in map(b.encode, lines)],
                           args.repeats)
    t_pre, _ = best_time(lambda: pretokenize(unseen), args.repeats)
    t_hf_cold = hf_cold(lambda h: h.encode(unseen))
    t_export, enc = best_time(lambda: exported.encode(unseen), args.repeats)
    t_hf_pre, _ = best_time(lambda: exported.pre_tokenizer.pre_tokenize_str(unseen), args.repeats)
    t_batch = hf_cold(lambda h: h.encode_batch(lines))
    t_hf_own, enc_own = best_time(lambda: hf.encode(unseen), args.repeats)
    assert enc.ids == ids, "the export encodes differently"
    rows = [("ByteLevelBPE, one call, cold cache", t_cold, len(ids)),
            ("ByteLevelBPE, one call, warm cache", t_warm, len(ids)),
            ("ByteLevelBPE, line by line, cold cache", t_lines, "-"),
            ("ByteLevelBPE pre-tokenization only (Python re)", t_pre, "-"),
            ("HF, our merges, one call, cold cache", t_hf_cold, len(enc.ids)),
            ("HF, our merges, one call, warm cache", t_export, len(enc.ids)),
            ("HF, our merges, encode_batch over lines, cold", t_batch, "-"),
            ("HF pre-tokenization only (Oniguruma, our pattern)", t_hf_pre, "-"),
            ("HF, HF-trained merges, one call, warm cache", t_hf_own, len(enc_own.ids))]
    table(f"Encoding {mb:.2f} MB of unseen text (1 thread; 'cold' = empty pre-token cache)",
          ("encoder", "MB per second", "time / HF cold (same merges)", "tokens"),
          [(name, f"{mb / t:.2f}", f"{t / t_hf_cold:.2f}", n) for name, t, n in rows])

if __name__ == "__main__":
    main()
