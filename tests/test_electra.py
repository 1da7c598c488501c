"""lecture_pkg.models.electra against Hugging Face's ELECTRA (random small configs, both
directions), and the replaced-token-detection objective's invariants."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.masks import IGNORE_INDEX, mlm_mask
from lecture_pkg.models.electra import (
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraModel,
    replaced_token_detection,
    share_embeddings,
)

transformers = pytest.importorskip("transformers")

TOL = {"rtol": 1e-5, "atol": 1e-5}


def hf_config(**overrides: object) -> transformers.ElectraConfig:
    sizes = {"vocab_size": 97, "embedding_size": 16, "hidden_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 40,
             "max_position_embeddings": 20, "type_vocab_size": 2,
             "attn_implementation": "eager"}
    return transformers.ElectraConfig(**{**sizes, **overrides})


def hf_model(cls_name: str, **overrides: object) -> torch.nn.Module:
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(hf_config(**overrides)).eval()
    with torch.no_grad():  # LayerNorms (1, 0) and zero biases would hide misnamed weights
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": (torch.arange(11) >= 6).long().expand(3, 11)}


@pytest.mark.parametrize("embedding_size", [16, 32])  # with and without the projection
def test_electra_model_matches_hf(embedding_size: int) -> None:
    hf = hf_model("ElectraModel", embedding_size=embedding_size)
    ours = ElectraModel.from_hf(hf)
    assert (ours.project is None) == (embedding_size == 32)
    with torch.no_grad():
        ref = hf(**inputs(), output_hidden_states=True, output_attentions=True)
        out = ours(**inputs(), output_attentions=True)
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(out.attentions, ref.attentions, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_discriminator_matches_hf_electra_for_pretraining_both_ways() -> None:
    hf = hf_model("ElectraForPreTraining", hidden_act="gelu")
    ours = ElectraForPreTraining.from_hf(hf)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs()).logits, hf(**inputs()).logits, **TOL)
    back = transformers.ElectraForPreTraining(hf.config).eval()
    back.load_state_dict(ours.hf_state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs()).logits, hf(**inputs()).logits, **TOL)


def test_generator_matches_hf_electra_for_masked_lm_with_tied_decoder() -> None:
    hf = hf_model("ElectraForMaskedLM")
    assert hf.generator_lm_head.weight is hf.electra.embeddings.word_embeddings.weight
    ours = ElectraForMaskedLM.from_hf(hf)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs()).logits, hf(**inputs()).logits, **TOL)
    back = transformers.ElectraForMaskedLM(hf.config).eval()
    back.load_state_dict(ours.hf_state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs()).logits, hf(**inputs()).logits, **TOL)


def test_config_from_hf_and_wrong_class() -> None:
    cfg = ElectraConfig.from_hf(hf_config())
    assert (cfg.embedding_size, cfg.hidden_size, cfg.num_layers) == (16, 32, 2)
    with pytest.raises(TypeError, match="ElectraForPreTraining"):
        ElectraForPreTraining.from_hf(transformers.BertModel(transformers.BertConfig(
            vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=8)))


def small_pair() -> tuple[ElectraForMaskedLM, ElectraForPreTraining]:
    torch.manual_seed(0)
    disc = ElectraForPreTraining(ElectraConfig(vocab_size=50, embedding_size=16,
                                               hidden_size=32, num_layers=1, num_heads=2,
                                               intermediate_size=32, max_positions=16,
                                               dropout=0.0))
    gen = ElectraForMaskedLM(ElectraConfig(vocab_size=50, embedding_size=16, hidden_size=16,
                                           num_layers=1, num_heads=2, intermediate_size=16,
                                           max_positions=16, dropout=0.0))
    share_embeddings(gen, disc)
    return gen, disc


def test_replaced_token_detection_labels_and_shared_gradients() -> None:
    gen, disc = small_pair()
    assert gen.electra.token is disc.electra.token
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (4, 12), generator=g)
    masked, labels = mlm_mask(ids, 50, 4, mlm_probability=0.3, generator=g)
    out = replaced_token_detection(gen, disc, ids, masked, labels,
                                   generator_rng=torch.Generator().manual_seed(1))
    selected = labels != IGNORE_INDEX
    # only selected positions may change; a label is True exactly where the token changed
    assert torch.equal(out.corrupted[~selected], ids[~selected])
    assert torch.equal(out.replaced, out.corrupted != ids) and out.replaced.any()
    manual = torch.nn.functional.binary_cross_entropy_with_logits(
        out.rtd_logits, out.replaced.float())
    torch.testing.assert_close(out.rtd_loss, manual)
    torch.testing.assert_close(out.loss, out.mlm_loss + 50 * out.rtd_loss)
    out.loss.backward()  # the shared embedding gets gradient from both models
    assert disc.electra.token.weight.grad is not None and gen.mlm_bias.grad is not None


def test_replaced_token_detection_checks_shapes() -> None:
    gen, disc = small_pair()
    ids = torch.randint(5, 50, (2, 8))
    with pytest.raises(ValueError, match="one shape"):
        replaced_token_detection(gen, disc, ids, ids[:, :7], ids)
