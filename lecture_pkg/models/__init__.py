"""The book's models, each one file on top of :mod:`lecture_pkg.layers`: only what is particular
to the model (embeddings, heads, position scheme, weight names) lives in its file.

Rules every model file follows, so that one model read teaches how to read the others:

- **Config fields are named as in the Hugging Face config of the model the file mirrors**
  (``GPT2Config``'s ``n_embd``, ``BertConfig``'s ``hidden_size``, ``T5Config``'s ``d_model``),
  so a reader can hold the two side by side; ``Config.from_hf(hf_config)`` converts and refuses
  settings the model does not implement, by name.
- **Outputs are NamedTuples with Hugging Face's field names** (``logits``,
  ``last_hidden_state``, ``attentions``, ...): typed, and pytrees, so ``torch.compile``,
  ``torch.export`` and ONNX export take them unchanged.
- **Interop**, for every model with a Hugging Face counterpart (all but the small DETR), comes
  from :class:`~lecture_pkg.models.common.HFInterop` (``from_config``, ``from_hf``,
  ``hf_state_dict``); a model overrides only the weight conversion that is its own (GPT-2's
  transposed ``Conv1D`` layers, for one). Every such model is tested equal to its HF class.
- **Argument checks** live in ``_check_*`` helpers and :mod:`lecture_pkg.checks`, so the forward
  pass shown in the book reads as the model.
"""
