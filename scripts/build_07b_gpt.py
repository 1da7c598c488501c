"""Write book/07b_gpt.ipynb from the cells below (unexecuted; run `make execute
NOTEBOOKS=book/07b_gpt.ipynb` afterwards). Keeping the chapter as a plain Python list makes it
reviewable as a diff; the notebook with its outputs is what the book stores."""

from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SETUP = nbformat.read(ROOT / "book" / "05_positional_encoding.ipynb", 4).cells
SETUP = next(c for c in SETUP if c.cell_type == "code").source

CELLS: list[tuple[str, str] | tuple[str, str, list[str]]] = []


def md(text: str) -> None:
    CELLS.append(("markdown", text.strip("\n")))


def code(text: str, *tags: str) -> None:
    CELLS.append(("code", text.strip("\n"), list(tags)))


md(r"""
# GPT: a decoder-only language model, trained, sampled and scaled

GPT is the third family of the chapter: a Transformer **decoder** without cross-attention, trained
to predict the next token {cite}`radford2018,radford2019`. Every position may look only at the
positions before it (the causal mask of the masking chapter), so the model is a language model:
it factorises the probability of a text as $p(w_1,\dots,w_T)=\prod_t p(w_t\mid w_{<t})$ and can
generate by sampling one token at a time.

**After this section you can**

- build a GPT-2 style model from the package's layers and check it against Hugging Face's
  `GPT2LMHeadModel`, weight for weight and logit for logit;
- train a small GPT on Python's documentation, tokenised with the book's byte-level BPE, and
  judge it by held-out perplexity against a bigram model;
- generate with greedy decoding, temperature, top-k and top-p, reproducibly, with a key-value
  cache, and measure what the cache costs in memory;
- fine-tune a GPT as a classifier in GPT-1's input format for entailment;
- count the parameters of GPT-1, GPT-2 and GPT-3 from their configurations, and check the
  lectures' numbers about them.
""")

code(SETUP)

code(r"""
import copy
import math

import altair as alt
import torch
import transformers

from lecture_pkg import generation, viz
from lecture_pkg.bpe import ByteLevelBPE
from lecture_pkg.data import pydoc_topics
from lecture_pkg.measure import wall_time
from lecture_pkg.models.gpt import (
    GPT,
    GPTConfig,
    GPTForSequenceClassification,
    lm_batches,
    next_token_loss,
)
from lecture_pkg.training import adamw, train, warmup_cosine

transformers.logging.set_verbosity_error()  # random-weight configs trigger warnings
""")

md(r"""
## The model: a stack of causal blocks and a tied output layer

The lectures write a pretrained decoder as

$$
h_1,\dots,h_T=\operatorname{Decoder}(w_1,\dots,w_T),\qquad
p(w_{t+1}\mid w_{\le t})=\operatorname{softmax}(A h_t + b).
$$

GPT-2 makes three choices inside that picture {cite}`radford2019`:

- **Positions** are learned vectors, one per position up to the context length (1024 for
  GPT-2), added to the token embeddings.
- **Blocks** are pre-LN: $x \leftarrow x + \operatorname{Attn}(\operatorname{LN}(x))$, then
  $x \leftarrow x + \operatorname{FFN}(\operatorname{LN}(x))$, with the tanh approximation of
  GELU in the FFN and one more LayerNorm after the last block.
- **The output layer is the input embedding** ($A = E$, $b = 0$): the logit of token $v$ is the
  dot product of $h_t$ with $v$'s embedding.

Its initialisation is $\mathcal N(0, 0.02^2)$ everywhere, except the two projections per block
that write into the residual stream. Their standard deviation is divided by
$\sqrt{2\cdot n_\text{layer}}$: the stream is a sum of $2 n_\text{layer}$ such writes, so its
variance then stays the same at any depth.

A GPT block is the package's `EncoderLayer` with `is_causal=True` ("encoder" there only means
"no cross-attention"). The model file holds what is particular to GPT:
""")

code(r"""
viz.show_source(GPT.features)
""")

md(r"""
Position ids count **real** tokens: a prompt padded on the left gets the positions
0, 1, 2, ... from its first real token, so padding does not change its logits. With a key-value
cache (`cache=model.new_cache()`) the call holds only the new tokens, whose positions continue
after the cached ones.

### Equal to Hugging Face, weight for weight

HF stores GPT-2's linear layers as `Conv1D`, whose weight is (in, out), the transpose of
`nn.Linear`'s, and fuses $W_Q, W_K, W_V$ into one `c_attn`. `GPT.from_hf` transposes and
splits; `hf_state_dict` does the reverse. A random-initialised small configuration, a batch with
left padding:
""")

code(r"""
# NBVAL_CHECK_OUTPUT
torch.manual_seed(0)
small = transformers.GPT2Config(vocab_size=101, n_positions=32, n_embd=48, n_layer=3,
                                n_head=4, pad_token_id=0)
hf = transformers.GPT2LMHeadModel(small).eval()
ours = GPT.from_hf(hf).eval()
ids = torch.randint(1, 101, (2, 10))
mask = torch.ones_like(ids)
mask[0, :4], ids[0, :4] = 0, 0  # row 0: four pads on the left
positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what HF's generate passes
with torch.no_grad():
    theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
    mine = ours(ids, mask)
    slow = ours(ids, mask, output_attentions=True)
real = mask.bool()
same_as_hf = torch.allclose(mine.logits[real], theirs[real], atol=1e-5)
same_paths = torch.allclose(mine.logits, slow.logits, atol=1e-5)
assert same_as_hf and same_paths
print(f"ours == HF on real tokens (1e-5): {same_as_hf}; "
      f"fused == own attention: {same_paths}")
back = transformers.GPT2LMHeadModel(small).eval()
back.load_state_dict(ours.hf_state_dict())  # HF loads our weights the other way round
with torch.no_grad():
    assert torch.allclose(back(ids).logits, ours(ids).logits, atol=1e-5)
print("layer 0 attention weights:", tuple(slow.attentions[0].shape),
      "(batch, heads, t, t)")
""")

md(r"""
The weights returned with `output_attentions=True` come from the package's own attention (the
teaching path); without it the model calls torch's fused `scaled_dot_product_attention`. Row 0's
first real token may attend to itself only, and no query ever attends to a pad:
""")

code(r"""
# NBVAL_CHECK_OUTPUT
w = slow.attentions[0][0, 0]  # example 0, head 0: (t, t)
assert torch.all(w[:, :4] == 0) and torch.all(w.triu(1) == 0)
print(w[4:7, 4:7].round(decimals=3))
""")

md(r"""
## Training a small GPT on Python's documentation

The corpus is the reference manual's topics that `help()` shows (`lecture_pkg.data`), about
0.47 MB of English about Python. The tokenizer is the book's byte-level BPE, trained here on the
same text, with four special tokens at the end of the vocabulary: GPT-2's `<|endoftext|>` and the
three that GPT-1 adds for fine-tuning. The last 10% of the token stream is held out.
""")

code(r"""
text = pydoc_topics()
specials = ["<|endoftext|>", "[START]", "[DELIM]", "[EXTRACT]"]
tokenizer = ByteLevelBPE(special_tokens=specials).train(text, budget(512, 4096))
stream = torch.tensor(tokenizer.encode(text))
split = int(0.9 * len(stream))
train_ids, held_out = stream[:split], stream[split:]
print(f"{len(text):,} characters -> {len(stream):,} tokens "
      f"({len(text) / len(stream):.2f} characters per token), vocabulary "
      f"{tokenizer.vocab_size}; {len(train_ids):,} for training, "
      f"{len(held_out):,} held out")
""")

md(r"""
**The baseline.** A bigram model predicts each token from the previous one only:
$p(w_t\mid w_{t-1}) = (c(w_{t-1}, w_t) + k) / (c(w_{t-1}) + kV)$, with add-$k$ smoothing so
that unseen pairs keep some probability. $k$ is chosen on the first half of the held-out tokens;
both models are scored on the second half. Perplexity is $e^{\text{loss}}$, the lectures'
definition: the number of equally likely tokens that would leave the model as uncertain.
""")

code(r"""
V = tokenizer.vocab_size
counts = torch.zeros(V, V)
pairs_seen = (train_ids[:-1], train_ids[1:])
counts.index_put_(pairs_seen, torch.ones(split - 1), accumulate=True)
tune, test = held_out[: len(held_out) // 2], held_out[len(held_out) // 2 :]


def bigram_loss(k: float, tokens: torch.Tensor) -> float:
    probs = (counts + k) / (counts + k).sum(dim=1, keepdim=True)
    return -probs[tokens[:-1], tokens[1:]].log().mean().item()


best_k = min([0.01, 0.03, 0.1, 0.3, 1.0], key=lambda k: bigram_loss(k, tune))
unigram = (torch.bincount(train_ids, minlength=V) + 1) / (split + V)
baselines = {"unigram": -unigram[test].log().mean().item(),
             f"bigram (k = {best_k})": bigram_loss(best_k, test)}
for name, loss in baselines.items():
    print(f"{name:>18}: held-out loss {loss:.3f}, perplexity {math.exp(loss):.1f}")
""")

md(r"""
**The loop** is `lecture_pkg.training.train`, the same for every chapter: AdamW (weight decay on
matrices only) with linear warmup and cosine decay, gradient clipping at norm 1, bf16 autocast
where the device has bf16 units (CUDA here; a CPU run stays in float32), and a progress bar. The
batches are random windows of the training stream, a function of the step, so a resumed run sees
the same data (`tests/test_gpt.py` checks that resuming from a checkpoint gives the same loss
curve, and that two DDP processes give the parameters of one).
""")

code(r"""
block = 64
config = GPTConfig(vocab_size=V, n_positions=block, n_embd=budget(128, 384),
                   n_layer=budget(4, 6), n_head=budget(4, 6), dropout=0.0,
                   embd_dropout=0.0)
steps, batch_size = budget(200, 3000), budget(16, 64)
torch.manual_seed(0)
model = GPT(config).to(device)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; {steps} steps of "
      f"{batch_size} x {block} tokens")

windows = test[: len(test) // block * block].view(-1, block).to(device)


def held_out_loss(m: torch.nn.Module) -> dict[str, float]:
    # every test token is a target once, except each window's first
    return {"held-out loss": next_token_loss(m(windows).logits, windows).item()}


def lm_loss(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    batch = batch.to(device)
    return next_token_loss(m(batch).logits, batch)


bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
optimizer = adamw(model, lr=3e-3)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(20, steps))
history = train(model, lm_batches(train_ids, batch_size, block), lm_loss, steps=steps,
                optimizer=optimizer, scheduler=schedule, clip_grad_norm=1.0,
                autocast_dtype=torch.bfloat16 if bf16 else None, eval_fn=held_out_loss,
                eval_every=steps // 2, log_every=10)
""")

code(r"""
curves = alt.Chart(alt.Data(values=history.records())).mark_line(point=True).encode(
    x=alt.X("step:Q"), y=alt.Y("value:Q", title="loss (nats per token)",
                                 scale=alt.Scale(zero=False)),
    color=alt.Color("series:N", title=None))
bigram_value = baselines[f"bigram (k = {best_k})"]
bigram_rule = alt.Chart(alt.Data(values=[{"bigram": bigram_value}]))
bigram_rule = bigram_rule.mark_rule(strokeDash=[4, 4]).encode(y="bigram:Q")
(curves + bigram_rule).properties(
    width=520, height=260, title="training loss, held-out loss, bigram (dashed)")
""")

code(r"""
gpt_loss = history.evals[-1]["held-out loss"]
bigram = baselines[f"bigram (k = {best_k})"]
assert history.losses[-1] < history.losses[0] - 1.0  # the loss fell
print(f"GPT:    held-out loss {gpt_loss:.3f}, perplexity {math.exp(gpt_loss):.1f}")
print(f"bigram: held-out loss {bigram:.3f}, perplexity {math.exp(bigram):.1f}")
print(f"GPT / bigram perplexity: {math.exp(gpt_loss - bigram):.2f} "
      f"({'better' if gpt_loss < bigram else 'not yet better'} than the bigram)")
""")

md(r"""
**What the measurement shows.** At the CPU budget the model sees about one pass over the
training tokens (steps x batch x block is close to the size of the training split). The printed
lines above compare it with the bigram on the same held-out tokens. In the run stored here the GPT
has **not yet reached the bigram** (perplexity 42.1 against 37.4), and its training loss is still
falling steeply at the end. A bigram's counts are exact after one pass over the data; the GPT has
to learn the same pair statistics by gradient descent before its longer context can pay off.
Trained longer outside the notebook (the same model, 400 steps of 16 x 64 tokens), its training
loss was 3.26 at step 375, well below the bigram's 3.72 on the held-out split, but that run's
held-out evaluation was not completed, so we do not claim its held-out number. `budget` trains a
larger model for 3000 steps on a GPU (not measured in this session). The lectures' premise, that
a Transformer language model beats count-based models, therefore does not show within a minute of
CPU training; the stored run says how far it got.
""")

md(r"""
## Sampling: greedy, temperature, top-k, top-p

Generation runs through `lecture_pkg.generation`, which sees a model only as a function
`step(new_tokens, cache) -> logits`. At every step the last position's logits $z$ become a
distribution:

- **temperature** $\tau$: $\operatorname{softmax}(z/\tau)$; $\tau<1$ sharpens it, $\tau>1$
  flattens it, $\tau\to 0$ is greedy decoding;
- **top-k**: keep the $k$ most probable tokens (GPT-2's samples in the lectures use it);
- **top-p** (nucleus) {cite}`holtzman2020`: keep the most probable tokens until their mass
  reaches $p$, then renormalise.

A `torch.Generator` makes each draw reproducible. `GPT.generate` checks that prompt plus new
tokens fit the context and that the settings make sense:
""")

code(r"""
model.eval()
prompt_text = "The for statement"
prompt = torch.tensor([tokenizer.encode(prompt_text)], device=device)
settings = {"greedy": {}, "T = 0.7": {"temperature": 0.7},
            "T = 1.0": {"temperature": 1.0}, "T = 1.5": {"temperature": 1.5},
            "T = 1.0, top-p 0.9": {"top_p": 0.9}, "T = 1.0, top-k 10": {"top_k": 10}}
for name, kwargs in settings.items():
    out = model.generate(prompt, max_new_tokens=20, do_sample=bool(kwargs),
                         generator=torch.Generator(device).manual_seed(0) if kwargs
                         else None, **kwargs)
    print(f"{name:>18}: {tokenizer.decode(out[0].tolist())!r}")
""")

code(r"""
for bad in ({"temperature": 0.0}, {"top_p": 1.5}, {"top_k": 0}, {"max_new_tokens": 64}):
    try:
        model.generate(prompt, do_sample="max_new_tokens" not in bad,
                       **{"max_new_tokens": 5, **bad})
    except ValueError as error:
        print(f"{bad}: {error}")
""")

md(r"""
### How temperature and top-p reshape the next-token distribution

The chart holds the model's logits for the next token after a prompt; the sliders apply
temperature and then the nucleus cut, in the browser (Vega expressions, so it works in the static
book). Grey bars are tokens the nucleus removes; the kept ones are renormalised. Below the chart
the same rule, computed by `lecture_pkg.generation`, is checked against a transcription of the
chart's expressions.
""")

code(r"""
context = "The return statement"
with torch.no_grad():
    context_ids = torch.tensor([tokenizer.encode(context)], device=device)
    logits = model(context_ids).logits[0, -1]
logits = logits.float().cpu()
rows = [{"token": repr(tokenizer.decode([int(i)]))[1:-1], "logit": logits[i].item(),
         "rank": rank} for rank, i in enumerate(logits.argsort(descending=True))]
temperature = alt.param(name="temperature", value=1.0, bind=alt.binding_range(
    min=0.1, max=2.0, step=0.05, name="temperature "))
top_p = alt.param(name="top_p", value=0.9, bind=alt.binding_range(
    min=0.05, max=1.0, step=0.05, name="top-p "))
top_logit = rows[0]["logit"]
chart = (
    alt.Chart(alt.Data(values=rows))
    .add_params(temperature, top_p)
    .transform_calculate(w=f"exp((datum.logit - {top_logit}) / temperature)")
    .transform_joinaggregate(total="sum(w)")
    .transform_calculate(p="datum.w / datum.total")
    .transform_window(mass="sum(p)", sort=[alt.SortField("rank")])
    .transform_calculate(kept="datum.mass - datum.p < top_p")
    .transform_calculate(kept_p="datum.kept ? datum.p : 0")
    .transform_joinaggregate(kept_mass="sum(kept_p)")
    .transform_calculate(q="datum.kept_p / datum.kept_mass")
    .transform_filter("datum.rank < 25")
    .mark_bar()
    .encode(x=alt.X("token:N", sort=alt.SortField("rank"), title=None),
            y=alt.Y("q:Q", title="probability after temperature and top-p"),
            color=alt.condition("datum.kept", alt.value("steelblue"),
                                alt.value("lightgrey")),
            tooltip=["token:N", alt.Tooltip("p:Q", format=".3f"),
                     alt.Tooltip("q:Q", format=".3f")])
    .properties(width=560, height=240,
                title=f"next token after {context!r}: the 25 most likely")
)
chart
""")

code(r"""
def chart_rule(tau: float, p: float) -> torch.Tensor:
    # the chart's expressions: softmax(z / tau), keep while the mass before < p
    probs = torch.softmax(logits.double() / tau, dim=-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]
    kept = torch.zeros_like(probs, dtype=torch.bool)
    kept[order] = before < p
    return torch.where(kept, probs, 0) / probs[kept].sum()


for tau, p in [(0.5, 0.5), (1.0, 0.9), (1.5, 0.95), (2.0, 1.0)]:
    scaled = generation.apply_temperature(logits.double(), tau)
    package = generation.top_p_filter(scaled, p)
    assert torch.allclose(package.softmax(-1), chart_rule(tau, p), atol=1e-12)
    print(f"T = {tau}, top-p = {p}: {int(package.isfinite().sum())} of {V} tokens kept")
""")

md(r"""
## The key-value cache: equal tokens, fewer FLOPs, memory that grows with length

Without a cache, step $t$ recomputes the keys and values of all $t$ earlier tokens. With one,
each layer stores them and step $t$ projects only the new token. Both must produce the same
tokens:
""")

code(r"""
prompts = torch.stack([train_ids[i : i + 8] for i in (0, 500)]).to(device)
new_tokens = 32
runs = {}
for use_cache in (True, False):
    def run() -> None:
        runs[use_cache] = model.generate(prompts, max_new_tokens=new_tokens,
                                         use_cache=use_cache)

    seconds = wall_time(run, repeats=1, warmup=0)
    print(f"use_cache={use_cache!s:>5}: {prompts.shape[0] * new_tokens / seconds:7.0f} "
          f"tokens/s")
assert torch.equal(runs[True], runs[False])
""")

md(r"""
The cache holds, for every layer, a key and a value vector per head and per token:

$$
\text{bytes} = 2 \cdot n_\text{layer} \cdot n_\text{head} \cdot d_\text{head} \cdot T \cdot
\text{bytes per element}\quad\text{(per sequence)}.
$$

Measured on the model just trained, after a pass over the two generated sequences:
""")

code(r"""
cache = model.new_cache()
with torch.no_grad():
    model(runs[True], cache=cache)
measured = sum(c.k.nbytes + c.v.nbytes for c in cache)
head_dim = config.n_embd // config.n_head
element = model.wte.weight.element_size()  # float32: 4 bytes
formula = (2 * config.n_layer * config.n_head * head_dim * runs[True].shape[1] * element
           * runs[True].shape[0])
assert measured == formula
print(f"measured {measured:,} bytes = formula {formula:,} bytes")
""")

code(r"""
# NBVAL_CHECK_OUTPUT
def cache_bytes(layers: int, heads: int, head_dim: int, tokens: int,
                bytes_per_element: int = 2) -> int:
    return 2 * layers * heads * head_dim * tokens * bytes_per_element


for name, (layers, heads, width, context) in {
        "GPT-2 124M": (12, 12, 768, 1024), "GPT-2 1.5B": (48, 25, 1600, 1024),
        "GPT-3 175B": (96, 96, 12288, 2048)}.items():
    total = cache_bytes(layers, heads, width // heads, context)
    print(f"{name}: {total / 2**20:8,.0f} MiB per sequence at {context} tokens in fp16 "
          f"({total // context:,} bytes per token)")
""")

md(r"""
## GPT-style fine-tuning: entailment as one sequence

GPT-1 fine-tunes the whole pretrained network with a new linear layer on the last token's hidden
state {cite}`radford2018`. For a pair of sentences, the input is one sequence with special
tokens around and between them; the lectures' natural-language-inference example:
""")

code(r"""
# NBVAL_CHECK_OUTPUT
def gpt1_format(premise: str, hypothesis: str) -> str:
    return f"[START]{premise}[DELIM]{hypothesis}[EXTRACT]"


example = gpt1_format("The man is in the doorway", " The person is near the door")
print(example)
special_ids = {s: tokenizer.encode(s)[0] for s in specials[1:]}
print({s: i - V for s, i in special_ids.items()}, "(ids from the vocabulary's end)")
""")

code(r"""
print([tokenizer.decode([i]) for i in tokenizer.encode(example)])
""")

md(r"""
We have no labelled entailment corpus offline, so here is a toy task built from the held-out
documentation that keeps the format: the premise is a sentence; the hypothesis is a five-word
stretch either **taken from it** (label 1, "the premise states it") or from a different sentence
(label 0). The classifier reads the hidden state at `[EXTRACT]`. We fine-tune the pretrained model
and, for comparison, the same architecture from a random initialisation, with equal steps.
""")

code(r"""
sentences = [s.strip() for s in text.replace("\n", " ").split(". ")]
sentences = [s for s in sentences if 6 <= len(s.split()) <= 16][: budget(1200, 20000)]
pairs_rng = torch.Generator().manual_seed(0)


def make_pair(i: int) -> tuple[str, int]:
    words = sentences[i].split()
    label = int(torch.randint(2, (1,), generator=pairs_rng))
    other = (i + 1 + int(torch.randint(len(sentences) - 1, (1,), generator=pairs_rng)))
    source = words if label else sentences[other % len(sentences)].split()
    start = int(torch.randint(len(source) - 4, (1,), generator=pairs_rng))
    hypothesis = " " + " ".join(source[start : start + 5])
    return gpt1_format(" ".join(words), hypothesis), label


pairs = [make_pair(i) for i in range(len(sentences))]
encoded = [tokenizer.encode(s) for s, _ in pairs]
fits = [i for i, tokens in enumerate(encoded) if len(tokens) <= block]  # the context
pairs, encoded = [pairs[i] for i in fits], [encoded[i] for i in fits]
length = max(map(len, encoded))
ids = torch.zeros(len(pairs), length, dtype=torch.long)
attention = torch.zeros_like(ids)
for row, tokens in enumerate(encoded):  # right padding; the head reads the last token
    ids[row, : len(tokens)], attention[row, : len(tokens)] = torch.tensor(tokens), 1
labels = torch.tensor([label for _, label in pairs])
n_train = int(0.8 * len(pairs))
share = labels[n_train:].float().mean().item()
print(f"{len(pairs)} pairs ({labels.float().mean():.0%} label 1), {n_train} for "
      f"training, longest {length} tokens; majority-class accuracy on the test pairs: "
      f"{max(share, 1 - share):.1%}")
""")

code(r"""
def fine_tune(gpt: GPT, steps: int) -> float:
    classifier = GPTForSequenceClassification(gpt, num_labels=2).to(device)
    rows = torch.Generator().manual_seed(1)

    def batch(step: int) -> tuple[torch.Tensor, ...]:
        pick = torch.randint(n_train, (16,), generator=rows)
        width = int(attention[pick].sum(1).max())  # right padding: trim to the longest
        return ids[pick, :width], attention[pick, :width], labels[pick]

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, a, y = (t.to(device) for t in b)
        return torch.nn.functional.cross_entropy(m(x, a), y)

    optimizer = adamw(classifier, lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(10, steps))
    train(classifier, batch, loss_fn, steps=steps, optimizer=optimizer,
          scheduler=schedule, log_every=10)
    classifier.eval()
    with torch.no_grad():
        guess = classifier(ids[n_train:].to(device), attention[n_train:].to(device))
    return (guess.argmax(-1).cpu() == labels[n_train:]).float().mean().item()


fine_tune_steps = budget(30, 400)
accuracy = {"pretrained GPT": fine_tune(copy.deepcopy(model), fine_tune_steps)}
torch.manual_seed(1)
accuracy["same GPT, random init"] = fine_tune(GPT(config).to(device), fine_tune_steps)
for name, value in accuracy.items():
    print(f"{name:>22}: test accuracy {value:.1%}")
""")

md(r"""
**What the measurement shows.** At this budget neither model learns the toy task: in the
stored run the pretrained model reaches 52.8% and the randomly initialised one 55.4%, against a
majority class of 50.3% on 195 test pairs, where one standard error is about 3.6 points. Both
are within noise of guessing, and the gap between them is too. Deciding whether five words occur in the
premise needs the `[EXTRACT]` state to compare the hypothesis with every premise position, and a
few hundred training pairs are not enough for that, from pretrained weights or from random ones.
What this section does show is GPT-1's input format and its head: one sequence with three special
tokens, and a linear layer on the last real token's state, trained together with the whole
network. The GPU budget runs 400 steps on up to 20,000 sentences (not measured in this session).
""")

md(r"""
## Sizes: GPT-1, GPT-2 and GPT-3 from their configurations

Parameters are counted on the `meta` device: the modules know their shapes but allocate no
memory, so even GPT-3 "builds" in a moment. Each GPT-2 count is checked against Hugging Face's
`GPT2LMHeadModel` for the same configuration, also built on `meta`.

The lectures describe GPT-1 as 12 layers, 768-dimensional states, a 3072-wide FFN and a BPE
vocabulary of 40,000 merges, and list it at "~150M parameters". HF's `OpenAIGPTConfig` holds the
released model's sizes (vocabulary 40,478, context 512). GPT-1 is post-LN and has no final
LayerNorm, so our GPT-2-style build of the same sizes has exactly one LayerNorm more.
""")

code(r"""
# NBVAL_CHECK_OUTPUT
def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


gpt1_config = transformers.OpenAIGPTConfig()
with torch.device("meta"):
    gpt1_hf = count(transformers.OpenAIGPTLMHeadModel(gpt1_config))
gpt1_ours = count(GPT.from_config(transformers.GPT2Config(
    vocab_size=gpt1_config.vocab_size, n_positions=gpt1_config.n_positions,
    n_embd=768, n_layer=12, n_head=12), device="meta"))
assert gpt1_config.vocab_size == 40_000 + 478  # 40,000 merges plus the base symbols
assert gpt1_ours - gpt1_hf == 2 * 768  # GPT-2's final LayerNorm (gain and bias)
assert abs(gpt1_hf - 117e6) < 1e6  # the paper's "117M"
assert abs(gpt1_hf - 150e6) / 150e6 > 0.2  # the lectures' "~150M" is a slip
print(f"GPT-1 (HF OpenAIGPT): {gpt1_hf:,} parameters, not ~150M "
      f"({(150e6 - gpt1_hf) / gpt1_hf:.0%} fewer)")

gpt_sizes = {"GPT-2 small": (12, 768, 12, 1024), "GPT-2 medium": (24, 1024, 16, 1024),
             "GPT-2 large": (36, 1280, 20, 1024), "GPT-2 XL": (48, 1600, 25, 1024),
             "GPT-3 175B": (96, 12288, 96, 2048)}
counts_by_name = {}
for name, (layers, width, heads, context) in gpt_sizes.items():
    hf_config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads,
                                        n_positions=context)
    counts_by_name[name] = count(GPT.from_config(hf_config, device="meta"))
    if not name.startswith("GPT-3"):
        with torch.device("meta"):
            hf_count = count(transformers.GPT2LMHeadModel(hf_config))
        assert counts_by_name[name] == hf_count
    print(f"{name:>13}: {counts_by_name[name]:>15,} parameters")
""")

md(r"""
The counts follow a closed form. Per block: $W_Q, W_K, W_V, W_O$ with biases ($4d^2+4d$), the
FFN ($8d^2+5d$) and two LayerNorms ($4d$), together $12d^2+13d$; plus the token and position
tables and the final LayerNorm:

$$
N = V d + n_\text{ctx} d + n_\text{layer}(12 d^2 + 13 d) + 2d.
$$
""")

code(r"""
# NBVAL_CHECK_OUTPUT
def closed_form(layers: int, width: int, context: int, vocab: int = 50257) -> int:
    blocks = layers * (12 * width**2 + 13 * width)
    return vocab * width + context * width + blocks + 2 * width


for name, (layers, width, _, context) in gpt_sizes.items():
    assert closed_form(layers, width, context) == counts_by_name[name], name
gpt3 = counts_by_name["GPT-3 175B"]
print(f"GPT-3: {gpt3 / 1e9:.2f}B; {96 * 12 * 12288**2 / gpt3:.1%} of it in the blocks' "
      f"matrices")
""")

md(r"""
The lectures also say GPT-3 "took ~3e23 FLOPS to train", "on 500 billion words", and that one
standard GPU would need 355 years and \$4.6M. Training costs about $6N$ FLOPs per token (2 for the
forward pass, 4 for the backward) {cite}`brown2020`. GPT-3 was trained on 300 billion tokens; 500
billion is roughly the size of its weighted dataset, not what it was trained on:
""")

code(r"""
# NBVAL_CHECK_OUTPUT
flops_300b = 6 * gpt3 * 300e9
flops_500b = 6 * gpt3 * 500e9
assert abs(flops_300b / 3e23 - 1) < 0.06  # 300B tokens gives the lectures' 3e23
assert flops_500b / 3e23 > 1.7  # 500B would give 5e23: not the slide's 3e23
seconds = 355 * 365.25 * 24 * 3600
print(f"6 N D: {flops_300b:.2e} FLOPs with 300B tokens, {flops_500b:.2e} with 500B")
print(f"355 years means {flops_300b / seconds / 1e12:.0f} TFLOP/s sustained on one "
      f"GPU; "
      f"$4.6M over {seconds / 3600:,.0f} GPU-hours is ${4.6e6 / (seconds / 3600):.2f} "
      f"per GPU-hour")
""")

md(r"""
## Several processes

`scripts/train_gpt.py` trains the same model from the command line, on one process or under
`torchrun` with DistributedDataParallel: gloo on CPUs, nccl with one GPU per process.
`--batch-size` is the global batch; each rank takes its share of every global batch and DDP
averages the gradients, so the result follows a single-process run on the same global batch.
`tests/test_gpt.py` runs 2 CPU processes for a few steps and checks exactly that.

```bash
python scripts/train_gpt.py --steps 300                                   # one process
torchrun --standalone --nproc_per_node=4 scripts/train_gpt.py --steps 300  # 4 GPUs
torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \
    --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 scripts/train_gpt.py    # 2 machines
```
""")

md(r"""
## Exercises

**1. Left padding needs position ids.** Pass explicit positions `0..t-1` to a left-padded row,
as a model that ignores the mask would, and show that its logits then differ from the unpadded
prompt's, while the default positions reproduce them.
""")

code(r"""
row, pads = train_ids[None, :20], 4
padded = torch.cat([torch.zeros(1, pads, dtype=torch.long), row[:, :20]], 1).to(device)
padded_mask = (torch.arange(pads + 20) >= pads).long()[None].to(device)
with torch.no_grad():
    alone = model(row[:, :20].to(device)).logits[0]
    right_positions = model(padded, padded_mask).logits[0, pads:]
    ignore_padding = torch.arange(pads + 20, device=device)[None]
    naive = model(padded, padded_mask, position_ids=ignore_padding).logits[0, pads:]
assert torch.allclose(right_positions, alone, atol=1e-4)
assert not torch.allclose(naive, alone, atol=1e-2)
""", "hide-cell")

md(r"""
**2. Temperature towards zero is greedy decoding.** Sample 20 tokens with $\tau = 10^{-4}$ and
compare with greedy decoding.
""")

code(r"""
cold = model.generate(prompt, max_new_tokens=20, do_sample=True, temperature=1e-4,
                      generator=torch.Generator(device).manual_seed(3))
assert torch.equal(cold, model.generate(prompt, max_new_tokens=20))
""", "hide-cell")

md(r"""
**3. Where do GPT-2 small's parameters live?** Split its 124M parameters into the token
table, the position table and the blocks, and check the shares add up.
""")

code(r"""
vocab_part, position_part = 50257 * 768, 1024 * 768
blocks_part = 12 * (12 * 768**2 + 13 * 768)
total = vocab_part + position_part + blocks_part + 2 * 768
assert total == counts_by_name["GPT-2 small"]
assert 0.31 < vocab_part / counts_by_name["GPT-2 small"] < 0.32  # almost a third
""", "hide-cell")

md(r"""
**4. A cache for a long conversation.** How many tokens of GPT-3's cache fit in 80 GB of GPU
memory in fp16, for one sequence? Compare with its 2048-token context.
""")

code(r"""
per_token = cache_bytes(96, 96, 128, 1)
fits = 80 * 10**9 // per_token
assert per_token == 4_718_592 and fits == 16_954  # about 8 contexts
""", "hide-cell")

md(r"""
## Summary

- GPT is a stack of causal pre-LN blocks over learned positions, with the output layer tied to
  the token embedding; ours equals Hugging Face's GPT-2 to $10^{-5}$, with left or right padding,
  and each loads the other's weights.
- A small GPT trained on Python's documentation is judged by held-out perplexity against a
  bigram model; what it reaches at this budget is reported above, measured.
- Temperature, top-k and top-p reshape one distribution; sampling is reproducible with a
  generator, and given the same seed equals Hugging Face's `generate` token for token (tested).
- The key-value cache keeps generation's tokens identical and costs
  $2\,n_\text{layer}\,n_\text{head}\,d_\text{head}$ elements per token: 36 KiB per token for
  GPT-2 small, 4.5 MiB for GPT-3 in fp16.
- GPT-1's fine-tuning puts a pair of sentences into one sequence between special tokens and
  reads a linear classifier off the last state.
- GPT-1 has 117M parameters (not ~150M), GPT-2 124M to 1.56B, GPT-3 175B; 6·N·D with 300B tokens
  gives the lectures' $3\times10^{23}$ FLOPs.

See the [bibliography](bibliography) for the papers.
""")


def build() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, source, *tags in CELLS:
        if kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            if tags and tags[0]:
                cell.metadata["tags"] = tags[0]
            nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    return nb


if __name__ == "__main__":
    nbformat.write(build(), ROOT / "book" / "07b_gpt.ipynb")
