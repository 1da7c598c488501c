"""lecture_pkg.transformer against torch.nn.Transformer, F.cross_entropy and the paper's
formulas; decoding through lecture_pkg.generation; invariances with hypothesis."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lecture_pkg.masks import causal_mask, padding_mask
from lecture_pkg.transformer import (
    Transformer,
    count_parameters,
    label_smoothed_cross_entropy,
    transformer_adam,
    transformer_lr,
    transformer_lr_lambda,
)

BOS, EOS, PAD = 1, 2, 0


def ids(batch: int, t: int, vocab: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, t), generator=torch.Generator().manual_seed(seed))


def small(**overrides) -> Transformer:  # noqa: ANN003
    torch.manual_seed(0)
    config = {"d_model": 16, "num_heads": 2, "num_encoder_layers": 2, "num_decoder_layers": 2,
              "d_ff": 32, "dropout": 0.0} | overrides
    return Transformer(11, 11, **config).double().eval()


# --------------------------------------------------------------------------------------------
# Equality with torch.nn.Transformer
# --------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train_mode", [False, True])
def test_from_torch_equals_nn_transformer_with_padding_and_causal_masks(
        norm_first: bool, train_mode: bool) -> None:
    torch.manual_seed(0)
    reference = nn.Transformer(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=3,
                               dim_feedforward=24, dropout=0.0, batch_first=True,
                               norm_first=norm_first, dtype=torch.float64)
    reference.train(train_mode)
    model = Transformer.from_torch(reference, 13, 13).train(train_mode)
    src, tgt = ids(3, 7, 13, seed=1), ids(3, 5, 13, seed=2)
    src_mask, tgt_mask = padding_mask([7, 4, 2], 7), padding_mask([5, 5, 3], 5)
    ours = model(src, tgt, src_mask, tgt_mask)
    hidden = reference(model.embed_source(src), model.embed_target(tgt),
                       tgt_mask=~causal_mask(5), src_key_padding_mask=~src_mask,
                       tgt_key_padding_mask=~tgt_mask, memory_key_padding_mask=~src_mask,
                       tgt_is_causal=True)
    torch.testing.assert_close(ours, model.output(hidden), atol=1e-6, rtol=0)
    assert ours.dtype == torch.float64 and ours.shape == (3, 5, 13)
    # the teaching path (own attention, weights returned) gives the same logits
    logits, weights = model(src, tgt, src_mask, tgt_mask, output_attentions=True)
    torch.testing.assert_close(logits, ours, atol=1e-10, rtol=0)
    assert [w.shape for w in weights["cross"]] == [(3, 4, 5, 7)] * 3
    assert [w.shape for w in weights["encoder"]] == [(3, 4, 7, 7)] * 2
    assert torch.all(weights["cross"][0][2, :, :, 2:] == 0)  # padding gets no weight
    assert torch.all(weights["decoder_self"][0][0].triu(1) == 0)  # causal


def test_from_torch_rejects_other_modules() -> None:
    with pytest.raises(TypeError, match="nn.Transformer"):
        Transformer.from_torch(nn.Linear(2, 2), 5, 5)  # type: ignore[arg-type]


def test_embeddings_are_scaled_and_positions_sinusoidal() -> None:
    model = small()
    src = ids(2, 6)
    pe = torch.stack([torch.stack([torch.sin(p / 10000 ** (torch.arange(0, 16, 2) / 16)),
                                   torch.cos(p / 10000 ** (torch.arange(0, 16, 2) / 16))],
                                  -1).flatten() for p in torch.arange(6.0)]).double()
    expected = model.src_embed.weight[src] * 4.0 + pe
    torch.testing.assert_close(model.embed_source(src), expected)
    torch.testing.assert_close(model.embed_target(src[:, 2:], start=2), expected[:, 2:])


def test_tying_shares_one_matrix_and_untied_has_three() -> None:
    tied = small()
    assert tied.src_embed.weight is tied.tgt_embed.weight is tied.output.weight
    untied = Transformer(11, 7, d_model=16, num_heads=2, num_encoder_layers=1,
                         num_decoder_layers=1, d_ff=8, share_embeddings=False, tie_output=False)
    pointers = {untied.src_embed.weight.data_ptr(), untied.tgt_embed.weight.data_ptr(),
                untied.output.weight.data_ptr()}
    assert len(pointers) == 3 and untied.output.weight.shape == (7, 16)
    # the counter counts the shared matrix once
    config = {"d_model": 16, "num_heads": 2, "num_encoder_layers": 1, "num_decoder_layers": 1,
              "d_ff": 8}
    assert count_parameters(11, **config) + 2 * 11 * 16 == count_parameters(
        11, share_embeddings=False, tie_output=False, **config)


def test_final_norm_follows_the_wiring() -> None:
    assert small().encoder_norm is None
    assert isinstance(small(wiring="pre").decoder_norm, nn.LayerNorm)


# --------------------------------------------------------------------------------------------
# Parameter counts: the paper's Table 3
# --------------------------------------------------------------------------------------------

def test_parameter_count_is_the_formula() -> None:
    d, f, n, v = 512, 2048, 6, 37000
    attention = 4 * (d * d + d)
    ffn = 2 * d * f + f + d
    encoder = attention + ffn + 2 * 2 * d
    decoder = 2 * attention + ffn + 3 * 2 * d
    assert count_parameters(v) == n * (encoder + decoder) + v * d
    assert round(count_parameters(v) / 1e6) == 63  # the paper rounds to 65M: see the chapter
    assert round(count_parameters(v, d_model=1024, num_heads=16, d_ff=4096) / 1e6) == 214


def test_counting_allocates_nothing() -> None:
    assert count_parameters(10**6, d_model=8192, num_heads=64, d_ff=32768) > 10**10


# --------------------------------------------------------------------------------------------
# The training recipe
# --------------------------------------------------------------------------------------------

def test_lr_schedule_peak_and_shape() -> None:
    assert transformer_lr(4000) == pytest.approx(6.9877e-4, rel=1e-4)
    assert transformer_lr(4000) == pytest.approx(512**-0.5 * 4000**-0.5)
    values = [transformer_lr(s) for s in range(1, 20001)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == 4000
    assert transformer_lr(16000) == pytest.approx(transformer_lr(4000) / 2)
    assert transformer_lr(100) == pytest.approx(100 * 512**-0.5 * 4000**-1.5)
    model = nn.Linear(2, 2)
    optimizer = transformer_adam(model.parameters())
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, transformer_lr_lambda(512, 10))
    rates = []
    for _ in range(12):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([transformer_lr(s, 512, 10) for s in range(1, 13)])


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.35])
def test_label_smoothing_equals_torch_cross_entropy(smoothing: float) -> None:
    logits = torch.randn(4, 6, 9, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 9, (4, 6))
    target[1, 3:] = PAD
    target[3, :] = PAD
    ours = label_smoothed_cross_entropy(logits, target, smoothing, ignore_index=PAD)
    expected = F.cross_entropy(logits.reshape(-1, 9), target.flatten(), ignore_index=PAD,
                               label_smoothing=smoothing)
    torch.testing.assert_close(ours, expected)
    g_ours, = torch.autograd.grad(ours, logits)
    g_ref, = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(g_ours, g_ref)
    assert torch.all(g_ours[3] == 0)
    summed = label_smoothed_cross_entropy(logits, target, smoothing, PAD, reduction="sum")
    torch.testing.assert_close(summed, F.cross_entropy(
        logits.reshape(-1, 9), target.flatten(), ignore_index=PAD, label_smoothing=smoothing,
        reduction="sum"))


def test_label_smoothing_is_cross_entropy_against_the_smoothed_distribution() -> None:
    logits, target, eps = torch.randn(5, 7, dtype=torch.float64), torch.arange(5), 0.1
    smoothed = torch.full((5, 7), eps / 7, dtype=torch.float64)
    smoothed[torch.arange(5), target] += 1 - eps
    expected = -(smoothed * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, target, eps), expected)


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wiring", ["post", "pre"])
def test_cached_decoding_equals_recomputation(wiring: str) -> None:
    model = small(wiring=wiring)
    src, mask = ids(3, 6, seed=3), padding_mask([6, 3, 5], 6)
    memory = model.encode(src, mask)
    tgt = torch.cat([torch.full((3, 1), BOS), ids(3, 7, seed=4)], dim=1)
    full = model.decode(tgt, memory, mask)
    cache, pieces = model.new_cache(), []
    for start, stop in [(0, 1), (1, 2), (2, 5), (5, 8)]:  # one token or several at a time
        pieces.append(model.decode(tgt[:, start:stop], memory, mask, cache=cache))
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-10, rtol=0)
    for num_beams in (1, 3):
        slow = model.generate(src, mask, bos_token_id=BOS, eos_token_id=EOS, use_cache=False,
                              num_beams=num_beams, max_new_tokens=12)
        fast = model.generate(src, mask, bos_token_id=BOS, eos_token_id=EOS,
                              num_beams=num_beams, max_new_tokens=12)
        assert torch.equal(fast, slow)


def test_beam_of_one_is_greedy_and_default_length_is_source_plus_50() -> None:
    model = small()
    src = ids(4, 5, seed=5)
    greedy = model.generate(src, bos_token_id=BOS, eos_token_id=EOS)
    assert greedy.shape[1] <= 1 + 5 + 50 and torch.all(greedy[:, 0] == BOS)
    beam = model.generate(src, bos_token_id=BOS, eos_token_id=EOS, num_beams=1)
    assert torch.equal(beam, greedy)
    never_stops = model.generate(src, bos_token_id=BOS, eos_token_id=[])
    assert never_stops.shape == (4, 1 + 5 + 50)


def test_generate_batches_with_padding_like_one_at_a_time() -> None:
    model = small()
    src, lengths = ids(3, 6, seed=6), [6, 2, 4]
    src = src.masked_fill(~padding_mask(lengths, 6), PAD)
    batched = model.generate(src, padding_mask(lengths, 6), bos_token_id=BOS, eos_token_id=EOS,
                             num_beams=2, max_new_tokens=10)
    for b, n in enumerate(lengths):
        alone = model.generate(src[b:b + 1, :n], bos_token_id=BOS, eos_token_id=EOS,
                               num_beams=2, max_new_tokens=10)
        width = alone.shape[1]
        assert torch.equal(batched[b, :width], alone[0])
        assert torch.all(batched[b, width:] == PAD)


# --------------------------------------------------------------------------------------------
# Invariances (hypothesis)
# --------------------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(2, 8))
def test_encoder_without_positions_is_permutation_equivariant(seed: int, t: int) -> None:
    model = small()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, t, 16, dtype=torch.float64, generator=generator)
    perm = torch.randperm(t, generator=generator)

    def encoder(h: torch.Tensor) -> torch.Tensor:  # the stack alone, positions left out
        for layer in model.encoder_layers:
            h, _ = layer(h)
        return h

    torch.testing.assert_close(encoder(x[:, perm]), encoder(x)[:, perm])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(2, 8), data=st.data())
def test_decoder_output_at_t_ignores_future_tokens(seed: int, t: int, data: st.DataObject) -> None:
    model = small()
    position = data.draw(st.integers(0, t - 2))
    tgt = ids(2, t, seed=seed)
    changed = tgt.clone()
    changed[:, position + 1:] = ids(2, t - position - 1, seed=seed + 1)
    memory = model.encode(ids(2, 5, seed=seed + 2))
    before, after = model.decode(tgt, memory), model.decode(changed, memory)
    torch.testing.assert_close(after[:, :position + 1], before[:, :position + 1])


# --------------------------------------------------------------------------------------------
# Numerics and bad input
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_is_finite_under_autocast(dtype: torch.dtype) -> None:
    model = small().float()
    src, tgt = ids(2, 9), ids(2, 7, seed=1)
    mask = padding_mask([9, 3], 9)
    with torch.autocast("cpu", dtype=dtype):
        logits = model(src, tgt, mask)
    assert torch.isfinite(logits).all()


def test_fully_masked_source_stays_finite() -> None:
    model = small()
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    logits, weights = model(src, tgt, mask, output_attentions=True)
    assert torch.isfinite(logits).all()
    assert torch.all(weights["cross"][0] == 0)
    torch.testing.assert_close(model(src, tgt, mask), logits)


def test_bad_configurations_name_the_argument() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        Transformer(10, 10, d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="activation"):
        Transformer(10, 10, d_model=8, num_heads=2, activation="tanh")
    with pytest.raises(ValueError, match="norm"):
        Transformer(10, 10, d_model=8, num_heads=2, norm="batch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="share_embeddings"):
        Transformer(10, 12, d_model=8, num_heads=2)
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), 1.0)
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), -0.1)
    with pytest.raises(ValueError, match="num_beams"):
        small().generate(ids(1, 3), bos_token_id=BOS, eos_token_id=EOS, num_beams=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        transformer_lr_lambda(512, 0)
    model, src = small(), ids(2, 4)
    with pytest.raises(ValueError, match="src_key_padding_mask"):
        model(src, src, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="src_key_padding_mask"):
        model(src, src, torch.ones(2, 4))
    with pytest.raises(ValueError, match="tgt_key_padding_mask"):
        model.decode(src, model.encode(src), tgt_key_padding_mask=torch.ones(2, 3, dtype=bool))
    with pytest.raises(TypeError, match="LongTensor"):
        model(src.float(), src)
    with pytest.raises(ValueError, match="logits"):
        label_smoothed_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1, 2]))


def test_padding_mask_from_pad_token_id() -> None:
    model = small(pad_token_id=PAD)
    src = ids(2, 6).masked_fill(~padding_mask([6, 3], 6), PAD)
    tgt = ids(2, 4, seed=1)
    torch.testing.assert_close(model(src, tgt), model(src, tgt, padding_mask([6, 3], 6)))
    assert not torch.allclose(model(src, tgt), model(src, tgt, torch.ones(2, 6, dtype=bool)))
    assert math.isfinite(model(src, tgt).sum().item())


def test_float32_fast_path_with_padding_and_causal_masks_equals_teaching_path() -> None:
    # float32 reaches torch's flash CPU kernel, which refuses a mask together with is_causal
    model = small().float()
    src, tgt = ids(3, 6), ids(3, 5, seed=1)
    src_mask, tgt_mask = padding_mask([6, 2, 4], 6), padding_mask([5, 3, 1], 5)
    fast = model(src, tgt, src_mask, tgt_mask)
    slow, _ = model(src, tgt, src_mask, tgt_mask, output_attentions=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# DeepNorm: DeepNet's alpha on the residual, beta on the initialisation
# --------------------------------------------------------------------------------------------


def test_deepnorm_scales_each_stack_residual_by_its_alpha() -> None:
    from lecture_pkg.layers import deepnet_constants

    n, m = 6, 2  # asymmetric: the encoder's alpha depends on N and M, the decoder's on M only
    model = small(wiring="deepnorm", num_encoder_layers=n, num_decoder_layers=m)
    (enc_alpha, _), (dec_alpha, _) = (deepnet_constants(n, m)[s] for s in ("encoder", "decoder"))
    assert enc_alpha == pytest.approx(0.81 * (n**4 * m) ** (1 / 16))
    assert dec_alpha == pytest.approx((3 * m) ** 0.25)
    layer = model.encoder_layers[0]
    assert layer.attn_block.alpha == layer.ffn_block.alpha == pytest.approx(enc_alpha)
    assert [b.alpha for d in model.decoder_layers
            for b in (d.self_block, d.cross_block, d.ffn_block)] == [pytest.approx(dec_alpha)] * 3 * m
    # the forward pass uses it: Norm(alpha x + F(x)) computed by hand for one encoder block
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    f = layer.ffn
    expected = layer.ffn_block.norm(enc_alpha * x + f(x))
    assert torch.allclose(layer.ffn_block(x, f), expected)
    # and the model is not post-LN with the same weights
    post = small(wiring="post", num_encoder_layers=n, num_decoder_layers=m)
    post.load_state_dict(model.state_dict())
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    assert not torch.allclose(model(src, tgt), post(src, tgt))


def test_deepnorm_init_puts_beta_on_ffn_value_and_output_projections() -> None:
    from lecture_pkg.layers import deepnet_constants

    n, m, d = 8, 2, 128
    torch.manual_seed(0)
    model = Transformer(11, 11, d_model=d, num_heads=4, num_encoder_layers=n,
                        num_decoder_layers=m, d_ff=256, wiring="deepnorm", dropout=0.0)
    betas = {s: c[1] for s, c in deepnet_constants(n, m).items()}

    def xavier_std(w: torch.Tensor, gain: float) -> float:
        return gain * math.sqrt(2.0 / (w.shape[0] + w.shape[1]))

    for stack, beta in betas.items():
        for layer in getattr(model, f"{stack}_layers"):
            attention = layer.self_attn
            for name, gain in (("q_proj", 1.0), ("k_proj", 1.0), ("v_proj", beta),
                               ("out_proj", beta)):
                w = getattr(attention, name).weight
                assert w.std().item() == pytest.approx(xavier_std(w, gain), rel=0.05), name
            for w in (layer.ffn.linear1.weight, layer.ffn.linear2.weight):
                assert w.std().item() == pytest.approx(xavier_std(w, beta), rel=0.05)
    assert betas["encoder"] != pytest.approx(betas["decoder"], rel=0.05)


# --------------------------------------------------------------------------------------------
# Corpus BLEU against sacreBLEU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_corpus_bleu_equals_sacrebleu(seed: int) -> None:
    sacrebleu = pytest.importorskip("sacrebleu")
    from lecture_pkg.transformer import corpus_bleu, ngram_matches

    g = torch.Generator().manual_seed(seed)
    refs = [torch.randint(0, 6, (int(torch.randint(3, 9, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(30)]
    hyps = []
    for ref in refs:  # corrupt each reference: some tokens replaced, some dropped
        hyp = [t if torch.rand(1, generator=g) > 0.3 else 7 for t in ref]
        hyps.append(hyp[: len(hyp) - int(torch.randint(0, 2, (1,), generator=g))])
    text = [[" ".join(f"w{t}" for t in s) for s in corpus] for corpus in (hyps, refs)]
    for smoothing, method in ((0.0, "none"), (1.0, "add-k"), ("exp", "exp")):
        expected = sacrebleu.corpus_bleu(text[0], [text[1]], tokenize="none",
                                         smooth_method=method, force=True)
        assert corpus_bleu(hyps, refs, smoothing=smoothing) == pytest.approx(expected.score)
    expected = sacrebleu.corpus_bleu(text[0], [text[1]], tokenize="none", force=True)
    assert ngram_matches(hyps, refs) == (expected.counts, expected.totals)
    assert corpus_bleu(hyps, refs, smoothing="exp") == pytest.approx(expected.score)


def test_corpus_bleu_exp_smoothing_matches_sacrebleu_default_without_4grams() -> None:
    sacrebleu = pytest.importorskip("sacrebleu")
    from lecture_pkg.transformer import corpus_bleu

    refs = [[1, 2, 3, 4], [5, 6, 7], [1, 5, 2, 6, 3]]
    hyps = [[1, 2, 4, 3], [6, 5, 7], [1, 5, 3, 6, 2]]  # bigrams match, no 3- or 4-gram
    text = [[" ".join(f"w{t}" for t in s) for s in corpus] for corpus in (hyps, refs)]
    expected = sacrebleu.corpus_bleu(text[0], [text[1]], tokenize="none", force=True)
    assert corpus_bleu(hyps, refs) == 0.0 < expected.score
    assert corpus_bleu(hyps, refs, smoothing="exp") == pytest.approx(expected.score)


def test_corpus_bleu_is_zero_without_a_matching_4gram_and_100_on_references() -> None:
    from lecture_pkg.transformer import corpus_bleu

    refs = [[1, 2, 3, 4, 5], [6, 7, 8]]
    assert corpus_bleu(refs, refs) == 100.0
    no_4gram = [[1, 2, 3, 9, 5], [6, 7, 8]]
    assert corpus_bleu(no_4gram, refs) == 0.0
    assert corpus_bleu(no_4gram, refs, smoothing=1.0) > 0.0
    with pytest.raises(ValueError, match="pair up"):
        corpus_bleu(refs, refs[:1])
