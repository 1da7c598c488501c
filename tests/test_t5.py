"""lecture_pkg.models.t5 against Hugging Face's T5ForConditionalGeneration (random small v1.0 and
v1.1 configs, both directions), and its input checks."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.models.t5 import T5, T5Config, shift_right, t5_loss

transformers = pytest.importorskip("transformers")

TOL = {"rtol": 1e-5, "atol": 1e-5}
VERSIONS = {"v1.0": {"feed_forward_proj": "relu"},
            "v1.1": {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}}


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """1e-5 relative to the largest logit: T5's N(0, 1) embeddings give logits of size ~10,
    where float32 rounding in a different summation order alone reaches 1e-5 absolute."""
    scale = ref.abs().max()
    torch.testing.assert_close(ours / scale, ref / scale, **TOL)


def hf_config(version: str = "v1.0", **overrides: object) -> transformers.T5Config:
    sizes = {"vocab_size": 77, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2,
             "num_decoder_layers": 3, "num_heads": 4, "relative_attention_num_buckets": 8,
             "relative_attention_max_distance": 20, "attn_implementation": "eager",
             "decoder_start_token_id": 0}
    return transformers.T5Config(**{**sizes, **VERSIONS[version], **overrides})


def hf_model(version: str = "v1.0", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(hf_config(version)).eval()
    with torch.no_grad():  # HF initialises the norms to 1: perturb them
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Encoder rows of 25 tokens (longer than max_distance, so the log buckets are used) and
    decoder rows of 30, with padding in one row of each."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(3, 25, dtype=torch.long)
    mask[1, 17:] = 0
    dec_mask = torch.ones(3, 30, dtype=torch.long)
    dec_mask[2, 20:] = 0
    return {"input_ids": torch.randint(1, 77, (3, 25), generator=g), "attention_mask": mask,
            "decoder_input_ids": torch.randint(1, 77, (3, 30), generator=g),
            "decoder_attention_mask": dec_mask}


@pytest.mark.parametrize("version", VERSIONS)
def test_matches_hf_logits_hidden_states_and_attentions(version: str) -> None:
    hf = hf_model(version)
    ours = T5.from_hf(hf)
    x = inputs()
    with torch.no_grad():
        ref = hf(**x, output_attentions=True)
        out = ours(**x, output_attentions=True)
    assert_logits_close(out.logits, ref.logits)
    torch.testing.assert_close(out.encoder_last_hidden_state, ref.encoder_last_hidden_state, **TOL)
    for ours_w, ref_w in [(out.encoder_attentions, ref.encoder_attentions),
                          (out.decoder_attentions, ref.decoder_attentions),
                          (out.cross_attentions, ref.cross_attentions)]:
        assert len(ours_w) == len(ref_w)
        for a, b in zip(ours_w, ref_w):
            torch.testing.assert_close(a, b, **TOL)
    assert out.decoder_attentions[0][0].triu(1).abs().max() == 0  # causal
    assert out.cross_attentions[-1][1, :, :, 17:].abs().max() == 0  # encoder padding


@pytest.mark.parametrize("version", VERSIONS)
def test_fast_path_equals_teaching_path(version: str) -> None:
    ours = T5.from_hf(hf_model(version))
    x = inputs()
    with torch.no_grad():
        fast = ours(**x)
        slow = ours(**x, output_attentions=True)
    assert fast.cross_attentions is None
    assert_logits_close(fast.logits, slow.logits)


@pytest.mark.parametrize("version", VERSIONS)
def test_hf_loads_our_state_dict(version: str) -> None:
    torch.manual_seed(1)
    ours = T5.from_config(hf_config(version)).eval()
    hf = transformers.T5ForConditionalGeneration(hf_config(version)).eval()
    hf.load_state_dict(ours.hf_state_dict(), strict=True)
    x = inputs(seed=2)
    with torch.no_grad():
        assert_logits_close(ours(**x).logits, hf(**x).logits)


def test_loss_and_shift_right_equal_hf() -> None:
    hf = hf_model("v1.0")
    ours = T5.from_hf(hf)
    x = inputs()
    labels = x["decoder_input_ids"].clone()
    labels[2, 20:] = IGNORE_INDEX
    decoder_input_ids = shift_right(labels)
    assert torch.equal(decoder_input_ids, hf._shift_right(labels))
    with torch.no_grad():
        ref = hf(input_ids=x["input_ids"], attention_mask=x["attention_mask"], labels=labels)
        out = ours(x["input_ids"], decoder_input_ids, x["attention_mask"])
    torch.testing.assert_close(t5_loss(out.logits, labels), ref.loss, **TOL)


def test_padding_and_relative_bias() -> None:
    """A padded encoder row equals the row alone; the bias is one table per stack, shared by
    every layer, and moving it changes the output (so the tests above test positions)."""
    ours = T5.from_hf(hf_model("v1.0"))
    x = inputs()
    with torch.no_grad():
        memory, _ = ours.encode(x["input_ids"], x["attention_mask"])
        alone, _ = ours.encode(x["input_ids"][1:2, :17])
        torch.testing.assert_close(memory[1, :17], alone[0], **TOL)
        biases = [m for m in ours.modules() if type(m).__name__ == "RelativePositionBias"]
        assert len(biases) == 2  # one in the encoder, one in the decoder
        before = ours(**x).logits
        ours.encoder.relative_bias.bias.weight.add_(1.0 * torch.randn(8, 4))
        assert (ours(**x).logits - before).abs().max() > 1e-3
    assert all(layer.self_attn.scale == 1.0 for layer in ours.encoder.layers)


def test_from_config_counts_match_hf_on_meta() -> None:
    for sizes, expected in [({}, 60_506_624),  # t5-small
                            ({"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
                             222_903_552)]:  # t5-base
        config = transformers.T5Config(**sizes)
        ours = T5.from_config(config, device="meta")
        with torch.device("meta"):
            hf = transformers.T5ForConditionalGeneration(config)
        n_ours = sum(p.numel() for p in ours.parameters())
        assert n_ours == sum(p.numel() for p in hf.parameters()) == expected


def test_config_translation() -> None:
    config = T5Config.from_hf(hf_config("v1.1"))
    assert (config.activation, config.rescale_output) == ("geglu_tanh", False)
    assert T5Config.from_hf(hf_config("v1.0")).rescale_output
    with pytest.raises(ValueError, match="num_heads \\* d_kv = 64 must equal d_model = 32"):
        T5Config.from_hf(hf_config(d_kv=16))
    with pytest.raises(TypeError, match="T5Config"):
        T5Config.from_hf(transformers.BertConfig())


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small() -> T5:
    return T5.from_config(hf_config()).eval()


def test_bad_ids(small: T5) -> None:
    ok = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 77\)"):
        small(torch.tensor([[1, 77]]), ok)
    with pytest.raises(ValueError, match=r"decoder_input_ids must lie in \[0, 77\)"):
        small(ok, torch.tensor([[-1, 3]]))
    with pytest.raises(TypeError, match="decoder_input_ids must be an integer tensor"):
        small(ok, ok.float())


def test_bad_masks(small: T5) -> None:
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of its ids \(2, 5\)"):
        small(ids, ids, attention_mask=torch.ones(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="decoder_attention_mask must have the shape"):
        small(ids, ids, decoder_attention_mask=torch.ones(5, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 1 but the encoder's output has 2"):
        small(ids, ids[:1])


def test_from_hf_wrong_architecture() -> None:
    encoder_only = transformers.T5EncoderModel(hf_config())
    with pytest.raises(TypeError, match="T5ForConditionalGeneration, got .*T5EncoderModel"):
        T5.from_hf(encoder_only)
    # v1.1 weights (wi_0/wi_1) are refused by a v1.0 model instead of silently skipped
    with pytest.raises(ValueError, match="no counterpart.*wi_0"):
        T5.from_config(hf_config("v1.0")).load_hf_state_dict(hf_model("v1.1").state_dict())


@pytest.mark.gpu
def test_t5_on_gpu_matches_cpu() -> None:
    ours = T5.from_hf(hf_model("v1.1"))
    x = inputs()
    with torch.no_grad():
        cpu = ours(**x).logits
        gpu = ours.to("cuda")(**{k: v.cuda() for k, v in x.items()}).logits
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_initialisation_matches_hf_statistics() -> None:
    config = hf_config(d_model=64, d_kv=16, d_ff=128)
    torch.manual_seed(0)
    ours, hf = T5.from_config(config), transformers.T5ForConditionalGeneration(config)
    pairs = [(ours.shared.weight, hf.shared.weight),
             (ours.encoder.layers[0].self_attn.q_proj.weight,
              hf.encoder.block[0].layer[0].SelfAttention.q.weight),
             (ours.decoder.layers[1].ffn.linear2.weight,
              hf.decoder.block[1].layer[2].DenseReluDense.wo.weight),
             (ours.encoder.relative_bias.bias.weight,
              hf.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight)]
    for a, b in pairs:
        assert abs(a.std().item() / b.std().item() - 1) < 0.25, (a.std(), b.std())


def test_relative_bias_is_computed_once_per_stack() -> None:
    """The bias is computed once per forward in each stack and shared by all its layers (HF
    computes it in the first layer and passes it on); a per-layer recomputation would be a
    different, slower model with the same weights."""
    ours = T5.from_config(hf_config()).eval()
    calls = {"encoder": 0, "decoder": 0}
    for name in calls:
        getattr(ours, name).relative_bias.register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    with torch.no_grad():
        ours(**inputs())
    assert calls == {"encoder": 1, "decoder": 1}
    assert len(ours.encoder.layers) == 2 and len(ours.decoder.layers) == 3
