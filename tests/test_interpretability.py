"""lecture_pkg.interpretability: every score, attribution and patch on models whose answer is
known, and every hook against an independent recomputation."""

import copy
import math

import pytest
import torch

from lecture_pkg.interpretability import (
    NoFeedForward,
    ablate_heads,
    activation_patching,
    attention_only_gpt,
    composition_scores,
    direct_logit_attribution,
    head_means,
    head_weights,
    induction_scores,
    logit_difference,
    logit_lens,
    nats_lost,
    ov_copying_scores,
    prefix_matches,
    previous_token_scores,
    repeat_losses,
    repeat_span_batches,
    repeated_tokens,
    row_losses,
    run_with_cache,
    token_losses,
)
from lecture_pkg.models.gpt import GPT, GPTConfig


def small_gpt(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> GPT:
    torch.manual_seed(seed)
    config = {"vocab_size": 11, "n_positions": 16, "n_embd": 12, "n_layer": 2, "n_head": 3,
              "dropout": 0.0, "embd_dropout": 0.0, **overrides}
    model = GPT(GPTConfig(**config), dtype=dtype).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that no term hides behind a 1 or 0
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.1)
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 0.3)
    return model


def ids_for(model: GPT, batch: int = 3, t: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(model.config.vocab_size, (batch, t),
                         generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the repeated-tokens task

def test_repeated_tokens_are_periodic_with_their_length():
    ids, lengths = repeated_tokens(64, 20, 7, min_length=3,
                                   generator=torch.Generator().manual_seed(0))
    assert ids.shape == (64, 20) and lengths.shape == (64,)
    assert int(lengths.min()) >= 3 and int(lengths.max()) <= 10
    assert len(set(lengths.tolist())) > 3  # lengths vary between rows
    for row, length in zip(ids, lengths.tolist()):
        assert torch.equal(row[length:], row[:20 - length])


def test_repeated_tokens_default_is_two_equal_halves():
    ids, lengths = repeated_tokens(5, 12, 9, generator=torch.Generator().manual_seed(1))
    assert lengths.tolist() == [6] * 5
    assert torch.equal(ids[:, :6], ids[:, 6:])


def test_repeated_tokens_rejects_bad_arguments():
    with pytest.raises(ValueError, match="min_length"):
        repeated_tokens(2, 10, 5, min_length=6)
    with pytest.raises(ValueError, match="vocab_size"):
        repeated_tokens(2, 10, 1)


class _Oracle(torch.nn.Module):
    """Knows each row's period: puts all its mass on the copied token (uniform in the first
    copy), so its first-copy loss is ln V and its repeat loss 0."""

    def __init__(self, lengths: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.lengths, self.vocab = lengths, vocab

    def forward(self, ids):
        batch, t = ids.shape
        logits = torch.zeros(batch, t, self.vocab)
        for b, length in enumerate(self.lengths.tolist()):
            for i in range(length, t - 1):  # position i predicts token i + 1 = token i + 1 - L
                logits[b, i, ids[b, i + 1 - length]] = 1e4
        return type("Out", (), {"logits": logits})()


def test_repeat_losses_of_an_oracle_and_of_a_uniform_model():
    ids, lengths = repeated_tokens(8, 16, 13, min_length=3,
                                   generator=torch.Generator().manual_seed(2))
    first, second = repeat_losses(_Oracle(lengths, 13), ids, lengths)
    assert first == pytest.approx(math.log(13)) and second == pytest.approx(0.0, abs=1e-6)
    uniform = attention_only_gpt(GPTConfig(vocab_size=13, n_positions=16, n_embd=8, n_layer=1,
                                           n_head=2))
    with torch.no_grad():
        uniform.lm_head.weight.zero_()  # tied: the embedding is zero too, every logit 0
    assert repeat_losses(uniform, ids, lengths) == pytest.approx((math.log(13),) * 2)
    with pytest.raises(ValueError, match="ids must have shape"):
        repeat_losses(uniform, ids[:2], lengths)


def test_token_losses_match_cross_entropy():
    model = small_gpt()
    ids = ids_for(model)
    logits = model(ids).logits
    reference = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:],
                                                  reduction="none")
    torch.testing.assert_close(token_losses(model, ids), reference)


def test_attention_only_gpt_has_no_ffn():
    model = attention_only_gpt(GPTConfig(vocab_size=9, n_positions=8, n_embd=8, n_layer=2,
                                         n_head=2, dropout=0.1))
    assert all(isinstance(block.ffn, NoFeedForward) for block in model.blocks)
    assert model.config.dropout == 0.0
    _, cache = run_with_cache(model.eval(), ids_for(model, t=8))
    assert all(float(cache[f"mlp_out{i}"].abs().max()) == 0.0 for i in range(2))


# ---------------------------------------------------------------- hooks

def test_cache_is_the_residual_stream_decomposition():
    model = small_gpt()
    ids = ids_for(model)
    logits, cache = run_with_cache(model, ids)
    torch.testing.assert_close(logits, model(ids).logits)
    embed = model.wte(ids) + model.wpe(torch.arange(ids.shape[1]))
    torch.testing.assert_close(cache["resid_pre0"], embed)
    stream = embed
    for i, block in enumerate(model.blocks):
        attn = block.self_attn
        heads = sum(cache[f"z{i}"][:, :, h] @ head_weights(model, i, h)["W_O"]
                    for h in range(attn.num_heads))
        torch.testing.assert_close(cache[f"attn_out{i}"], heads + attn.out_proj.bias)
        stream = stream + cache[f"attn_out{i}"] + cache[f"mlp_out{i}"]
        torch.testing.assert_close(cache[f"resid_pre{i + 1}"], stream)
    reference = model(ids, output_attentions=True).attentions
    for i, weights in enumerate(reference):
        torch.testing.assert_close(cache[f"pattern{i}"], weights)


def test_hooks_are_removed_and_bad_names_refused():
    model = small_gpt()
    ids = ids_for(model)
    run_with_cache(model, ids, {"z0": lambda z: z})
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    with pytest.raises(KeyError, match="not activations"):
        run_with_cache(model, ids, {"resid_pre9": lambda x: x})
    with pytest.raises(ValueError, match=r"\(batch, t\)"):
        run_with_cache(model, ids[0])
    with pytest.raises(TypeError, match="GPT"):
        run_with_cache(torch.nn.Linear(2, 2), ids)


# ---------------------------------------------------------------- attention scores

def test_prefix_matches_by_hand():
    ids = torch.tensor([[5, 6, 7, 5, 6, 5]])
    matches = prefix_matches(ids)
    # query 3 (token 5): key 1 follows the 5 at 0; query 5 (token 5): keys 1 and 4
    expected = torch.zeros(1, 6, 6, dtype=torch.bool)
    expected[0, 3, 1] = expected[0, 5, 1] = expected[0, 5, 4] = True
    expected[0, 4, 2] = True  # query 4 (token 6): key 2 follows the 6 at 1
    assert torch.equal(matches, expected)


def test_previous_token_and_induction_scores_on_hand_built_patterns():
    t, length = 10, 5
    ids, _ = repeated_tokens(1, t, 50, generator=torch.Generator().manual_seed(0))
    assert len(set(ids[0, :length].tolist())) == length  # no chance repeats in this draw
    previous = torch.zeros(1, 1, t, t)
    previous[0, 0, 0, 0] = 1.0
    previous[0, 0, torch.arange(1, t), torch.arange(t - 1)] = 1.0
    induction = torch.zeros(1, 1, t, t)
    induction[0, 0, :, 0] = 1.0
    queries = torch.arange(length, t)
    induction[0, 0, queries, 0] = 0.0
    induction[0, 0, queries, queries - length + 1] = 1.0
    patterns = [torch.cat([previous, induction], dim=1)]  # one layer, two heads
    # the induction head's query 1 attends to position 0, its previous token: 1 of 9 queries
    assert previous_token_scores(patterns).tolist() == [[1.0, pytest.approx(1 / 9)]]
    assert induction_scores(patterns, ids).tolist() == [[0.0, 1.0]]


def test_scores_of_a_model_attending_uniformly():
    """Zero query weights and biases: every head averages over its causal prefix, so the
    previous-token score is the mean of 1 / (i + 1) and the induction score is the mean share
    of matching keys."""
    model = small_gpt(n_layer=1)
    with torch.no_grad():
        model.blocks[0].self_attn.q_proj.weight.zero_()
        model.blocks[0].self_attn.q_proj.bias.zero_()
    ids, _ = repeated_tokens(4, 12, 11, min_length=3, generator=torch.Generator().manual_seed(3))
    _, cache = run_with_cache(model, ids)
    expected = sum(1 / (i + 1) for i in range(1, 12)) / 11
    torch.testing.assert_close(previous_token_scores([cache["pattern0"]]),
                               torch.full((1, 3), expected, dtype=torch.float64))
    shares = [sum(int(ids[b, j - 1] == ids[b, i]) for j in range(1, i + 1)) / (i + 1)
              for b in range(4) for i in range(12)
              if any(int(ids[b, j - 1] == ids[b, i]) for j in range(1, i + 1))]
    torch.testing.assert_close(induction_scores([cache["pattern0"]], ids),
                               torch.full((1, 3), sum(shares) / len(shares),
                                          dtype=torch.float64))


def test_scores_reject_bad_patterns():
    with pytest.raises(ValueError, match="patterns"):
        previous_token_scores([torch.ones(3, 3)])
    with pytest.raises(ValueError, match="do not match"):
        induction_scores([torch.ones(1, 1, 6, 6)], torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="no query"):
        induction_scores([torch.ones(1, 1, 3, 3)], torch.tensor([[1, 2, 3]]))


# ---------------------------------------------------------------- circuits from the weights

def _one_hot_model(vocab: int = 6, d: int = 8) -> GPT:
    """A 2-layer, 2-head model whose matrices are set by hand (norm gains 1)."""
    model = GPT(GPTConfig(vocab_size=vocab, n_positions=8, n_embd=d, n_layer=2, n_head=2,
                          dropout=0.0, embd_dropout=0.0), dtype=torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
        model.wte.weight.copy_(torch.eye(vocab, d))
    return model


def test_head_weights_fold_the_norm_gain():
    model = small_gpt()
    w = head_weights(model, 1, 2)
    block = model.blocks[1]
    x = torch.randn(5, 12, dtype=torch.float64)
    rows = slice(8, 12)
    q = (x * block.attn_block.norm.weight) @ block.self_attn.q_proj.weight[rows].T
    torch.testing.assert_close(x @ w["W_Q"], q)
    torch.testing.assert_close(w["W_QK"], w["W_Q"] @ w["W_K"].T)
    assert w["W_OV"].shape == (12, 12)
    with pytest.raises(ValueError, match="outside"):
        head_weights(model, 2, 0)


def test_composition_scores_known_answers():
    model = _one_hot_model()
    e = torch.eye(8, dtype=torch.float64)
    a0 = model.blocks[0].self_attn
    a1 = model.blocks[1].self_attn  # head_dim 4: head h owns rows 4h..4h+3 of q/k/v
    with torch.no_grad():
        a0.v_proj.weight[0] = e[0]  # layer 0, head 0 writes direction 5 from direction 0
        a0.out_proj.weight[5, 0] = 1.0
        a0.v_proj.weight[4] = e[1]  # layer 0, head 1 writes direction 6 from direction 1
        a0.out_proj.weight[6, 4] = 1.0
        a1.q_proj.weight[0] = e[2]  # layer 1, head 0: W_QK = e2 e5^T, keys read direction 5
        a1.k_proj.weight[0] = e[5]
        a1.q_proj.weight[4] = e[6]  # layer 1, head 1: queries read direction 6
        a1.k_proj.weight[4] = e[3]
    k_comp, q_comp = composition_scores(model, "K"), composition_scores(model, "Q")
    assert k_comp.shape == (2, 2, 2, 2)
    assert k_comp[1, 0, 0, 0] == pytest.approx(1.0)  # reads exactly what (0, 0) writes
    assert k_comp[1, 0, 0, 1] == 0.0 and k_comp[1, 1, 0, 0] == 0.0
    assert q_comp[1, 1, 0, 1] == pytest.approx(1.0) and q_comp[1, 0, 0, 0] == 0.0
    assert float(k_comp[0].abs().max()) == 0.0  # nothing earlier than layer 0
    assert float(composition_scores(small_gpt(), "V").max()) <= 1.0
    with pytest.raises(ValueError, match="kind"):
        composition_scores(model, "X")


def test_ov_copying_scores_known_answers():
    model = _one_hot_model(vocab=6, d=8)
    with torch.no_grad():
        # lm_head is tied to wte: W_U = W_E^T
        a = model.blocks[0].self_attn
        a.v_proj.weight[:4, :4] = torch.eye(4)  # head 0 copies directions 0..3
        a.out_proj.weight[:4, :4] = torch.eye(4)
        a.v_proj.weight[4:8, :4] = torch.eye(4)  # head 1 writes minus the token
        a.out_proj.weight[:4, 4:8] = -torch.eye(4)
    scores = ov_copying_scores(model)
    assert scores[0, 0] == pytest.approx(4 / 6)  # tokens 4, 5 lie outside its 4 dimensions
    assert scores[0, 1] == 0.0
    assert scores[1].tolist() == [pytest.approx(1 / 6)] * 2  # all-zero circuit: argmax is 0


# ---------------------------------------------------------------- ablation

def test_zero_ablation_equals_zeroing_w_o_by_hand():
    model = small_gpt()
    ids = ids_for(model)
    ablated, _ = run_with_cache(model, ids, ablate_heads(model, [(0, 1), (1, 2)]))
    by_hand = copy.deepcopy(model)
    with torch.no_grad():
        by_hand.blocks[0].self_attn.out_proj.weight[:, 4:8] = 0.0
        by_hand.blocks[1].self_attn.out_proj.weight[:, 8:12] = 0.0
    torch.testing.assert_close(ablated, by_hand(ids).logits)
    nothing, _ = run_with_cache(model, ids, ablate_heads(model, []))
    torch.testing.assert_close(nothing, model(ids).logits)
    assert float(nats_lost(model, ids, ablate_heads(model, [])).abs().max()) == 0.0


def test_mean_ablation_writes_the_mean():
    model = small_gpt()
    ids = ids_for(model)
    means = head_means(model, ids)
    assert means.shape == (2, 3, 4)
    _, cache = run_with_cache(model, ids)
    torch.testing.assert_close(means[1, 0], cache["z1"][:, :, 0].mean(dim=(0, 1)))
    _, edited = run_with_cache(model, ids, ablate_heads(model, [(1, 0)], means))
    torch.testing.assert_close(edited["z1"][:, :, 0], means[1, 0].expand(3, 10, 4))
    torch.testing.assert_close(edited["z1"][:, :, 1:], cache["z1"][:, :, 1:])
    with pytest.raises(ValueError, match="means must have shape"):
        ablate_heads(model, [(0, 0)], means[0])
    with pytest.raises(ValueError, match="outside"):
        ablate_heads(model, [(0, 3)])


def test_nats_lost_by_ablating_a_head_is_the_loss_difference():
    model = small_gpt()
    ids = ids_for(model)
    edit = ablate_heads(model, [(1, 1)])
    ablated, _ = run_with_cache(model, ids, edit)
    expected = (torch.nn.functional.cross_entropy(ablated[:, :-1].transpose(1, 2), ids[:, 1:],
                                                  reduction="none").mean(-1)
                - token_losses(model, ids).mean(-1))
    torch.testing.assert_close(nats_lost(model, ids, edit), expected)


# ---------------------------------------------------------------- logit lens and attribution

def test_logit_lens_ends_at_the_logits_and_starts_at_the_embedding():
    model = small_gpt()
    ids = ids_for(model)
    lens = logit_lens(model, ids)
    assert lens.shape == (3, 3, 10, 11)
    torch.testing.assert_close(lens[-1], model(ids).logits)
    embed = model.wte(ids) + model.wpe(torch.arange(10))
    torch.testing.assert_close(lens[0], model.ln_f(embed) @ model.wte.weight.T)


def test_direct_logit_attribution_adds_up_to_the_logit():
    model = small_gpt()
    ids = ids_for(model)
    targets = ids_for(model, seed=5)
    names, parts = direct_logit_attribution(model, ids, targets)
    assert len(names) == parts.shape[0] == 1 + 2 * (3 + 2) + 1
    assert names[:2] == ["embed", "L0H0"] and names[-1] == "ln_f bias"
    logits = model(ids).logits.gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(parts.sum(0), logits)
    with pytest.raises(ValueError, match="targets"):
        direct_logit_attribution(model, ids, targets[:, :3])


def test_direct_attribution_of_a_head_by_hand():
    """A head's part, computed from the weights and the attention pattern alone (float64):
    sum over keys of pattern * LN(x_key) W_V W_O, through the final norm with sigma frozen."""
    model = small_gpt()
    ids = ids_for(model, batch=1)
    targets = ids_for(model, batch=1, seed=7)
    names, parts = direct_logit_attribution(model, ids, targets)
    _, cache = run_with_cache(model, ids)
    block = model.blocks[1]
    normed = block.attn_block.norm(cache["resid_pre1"])[0]  # (t, d)
    v_proj, out_proj = block.self_attn.v_proj, block.self_attn.out_proj
    values = normed @ v_proj.weight[8:12].T + v_proj.bias[8:12]  # (t, head_dim)
    written = cache["pattern1"][0, 2] @ values @ out_proj.weight[:, 8:12].T  # (t, d)
    final = cache["resid_pre2"][0]
    sigma = (final.var(-1, unbiased=False, keepdim=True) + model.ln_f.eps).sqrt()
    direction = model.wte.weight[targets[0]] * model.ln_f.weight
    expected = ((written - written.mean(-1, keepdim=True)) / sigma * direction).sum(-1)
    torch.testing.assert_close(parts[names.index("L1H2"), 0], expected)


# ---------------------------------------------------------------- activation patching

def test_patching_reproduces_the_clean_and_the_corrupted_runs():
    model = small_gpt()
    clean, corrupt = ids_for(model, batch=1, seed=1), ids_for(model, batch=1, seed=2)
    metric = logit_difference(3, 4)
    clean_value = float(metric(model(clean).logits.detach()))
    corrupt_value = float(metric(model(corrupt).logits.detach()))
    result = activation_patching(model, clean, corrupt, metric)
    assert result.shape == (3, 10)
    # the stream entering ln_f at the last position is all the last logits read
    assert float(result[2, -1]) == pytest.approx(clean_value)
    assert result[2, :-1].tolist() == pytest.approx([corrupt_value] * 9)
    # every position at once, at the embedding: the clean run itself
    _, clean_cache = run_with_cache(model, clean)
    logits, _ = run_with_cache(model, corrupt, {"resid_pre0": lambda x: clean_cache["resid_pre0"]})
    assert float(metric(logits)) == pytest.approx(clean_value)
    # same prompt twice: patching changes nothing
    same = activation_patching(model, clean, clean, metric)
    torch.testing.assert_close(same, torch.full((3, 10), clean_value, dtype=torch.float32))
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, clean, corrupt[:, :5], metric)


def test_patching_every_position_of_any_layer_is_the_clean_run():
    model = small_gpt()
    clean, corrupt = ids_for(model, batch=2, seed=1), ids_for(model, batch=2, seed=2)
    clean_logits, clean_cache = run_with_cache(model, clean)
    for layer in range(3):
        name = f"resid_pre{layer}"
        logits, _ = run_with_cache(model, corrupt, {name: lambda x, n=name: clean_cache[n]})
        torch.testing.assert_close(logits, clean_logits)
    # an edit that returns its input, and ablating no head, change nothing
    same, _ = run_with_cache(model, corrupt, {f"z{i}": lambda z: z for i in range(2)})
    torch.testing.assert_close(same, model(corrupt).logits)
    none, _ = run_with_cache(model, corrupt, ablate_heads(model, [], head_means(model, clean)))
    torch.testing.assert_close(none, model(corrupt).logits)


def test_direct_attribution_depends_on_the_frozen_scale_only_through_one_factor():
    """Doubling the stream (every part) leaves the final norm's output unchanged: with sigma
    frozen at its value in the run, every part's share is unchanged too."""
    model = small_gpt()
    ids, targets = ids_for(model), ids_for(model, seed=5)
    names, parts = direct_logit_attribution(model, ids, targets)
    _, cache = run_with_cache(model, ids)
    final = cache["resid_pre2"]
    sigma = (final.var(-1, unbiased=False) + model.ln_f.eps).sqrt()
    # the parts other than ln_f's bias are linear in the stream divided by sigma
    no_bias = parts[:-1].sum(0)
    direction = model.wte.weight[targets] * model.ln_f.weight
    centred = final - final.mean(-1, keepdim=True)
    torch.testing.assert_close(no_bias, (centred * direction).sum(-1) / sigma)


def test_repeat_span_batches_repeat_and_control():
    tokens = torch.arange(1000) % 7 + 30  # ids 30..36; the alphabet is 0..4
    alphabet = torch.arange(5)
    repeat = repeat_span_batches(tokens, alphabet, 8, 40, seed=3, repeat=True,
                                 min_length=4, max_length=10)
    control = repeat_span_batches(tokens, alphabet, 8, 40, seed=3, repeat=False,
                                  min_length=4, max_length=10)
    a, b = repeat(5), control(5)
    assert a.shape == b.shape == (8, 40)
    torch.testing.assert_close(repeat(5), a)  # a function of the step
    for row_a, row_b in zip(a, b):
        spans = (row_a < 5).nonzero().flatten()
        marks = (row_b < 5).nonzero().flatten()
        assert torch.equal(spans, marks)  # the same places in both arms
        n = len(spans) // 2
        assert 4 <= n <= 10 and len(spans) == 2 * n
        first, second = row_a[spans[:n]], row_a[spans[n:]]
        assert torch.equal(first, second)  # shown twice
        assert torch.equal(row_b[spans[:n]], first)  # the control's first string is the same
        assert torch.equal(row_a[row_a >= 5], row_b[row_b >= 5])  # the same text around
    # the control's second strings differ from the first (almost surely, over 8 rows)
    assert any(not torch.equal(r[(r < 5).nonzero().flatten()][:len((r < 5).nonzero()) // 2],
                               r[(r < 5).nonzero().flatten()][len((r < 5).nonzero()) // 2:])
               for r in b)
    with pytest.raises(ValueError, match="window"):
        repeat_span_batches(tokens, alphabet, 8, 16, seed=0, max_length=10)
    with pytest.raises(ValueError, match="alphabet"):
        repeat_span_batches(tokens, alphabet[:1], 8, 48, seed=0)


def test_row_losses_on_the_fused_path_match_the_hooked_run():
    model = small_gpt()
    ids = ids_for(model)
    edit = ablate_heads(model, [(0, 2)])
    logits, _ = run_with_cache(model, ids, edit)  # the package's attention, patterns recorded
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:],
                                                 reduction="none").mean(-1)
    torch.testing.assert_close(row_losses(model, ids, edit), expected)
    torch.testing.assert_close(row_losses(model, ids), token_losses(model, ids).mean(-1))
    with pytest.raises(KeyError, match="not activations"):
        row_losses(model, ids, {"z7": lambda z: z})


# ---------------------------------------------------------------- the recorded continuation

def test_induction_continuation_reproduces_a_recorded_row(load_script):
    """lecture_pkg/recorded/induction_continuation_cpu.json (scripts/induction_continuation.py,
    command and time in benchmarks/RESULTS.md): the first evaluation of the first seed's
    repeat arm, retrained (its first eval_every steps)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = load_script("induction_continuation")
    recorded = json.loads((root / "lecture_pkg" / "recorded"
                           / "induction_continuation_cpu.json").read_text())
    assert recorded["settings"] == script.SETTINGS
    row = next(r for r in recorded["runs"] if r["repeat"])
    every = recorded["eval_every"]
    again = script.continuation(row["seed"], True, every, every)
    for then, now in zip(row["evals"][:2], again, strict=True):
        assert then["step"] == now["step"]
        assert abs(then["first"] - now["first"]) < 0.02
        assert abs(then["second"] - now["second"]) < 0.02
        torch.testing.assert_close(torch.tensor(now["induction"]),
                                   torch.tensor(then["induction"]), atol=0.01, rtol=0)
