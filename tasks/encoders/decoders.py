"""Decoder LLMs (Llama, Qwen, Mistral, SmolLM, ...) as encoders: what sets them apart from BERT-style ones.

A decoder here is a model type transformers has a causal-LM class for and no masked-LM class. Three things
change for one, and each is done here, once, for every stage that tokenizes or loads it:

- Its tokenizer may have no padding token (it pads with EOS then: the attention mask hides padding), and it
  does not end a text with EOS: embforge appends one, as LLM2Vec and E5-mistral do, so that a text's last token
  has read all of it even under causal attention (last-token pooling). The appended EOS is part of the saved
  tokenizer, so a trained model and its exported folder tokenize the same way.
- Its attention is causal unless made bidirectional, through transformers' own switch: `config.is_causal =
  False` makes the model's mask functions build a bidirectional mask (and is saved in config.json), and each
  attention module's `is_causal` flag tells the SDPA and flash kernels not to add a causal one of their own.
- It has no dropout by default, which dropout views need (`train.dropout`, LLM2Vec's SimCSE stage: 0.3).
"""

from __future__ import annotations

import torch
from tokenizers import processors
from transformers import PretrainedConfig, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

# The config fields that hold a model's dropout probabilities, by family (BERT's two, decoders' attention dropout).
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout")


def is_decoder(config: PretrainedConfig) -> bool:
    return (config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def end_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The token that ends a text: EOS, or [SEP] for a BERT tokenizer (a random decoder may be built with one)."""
    return tokenizer.eos_token or tokenizer.sep_token


def ready_tokenizer(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> PreTrainedTokenizerBase:
    """A decoder's tokenizer made to pad (with its end token where it has no padding token) and to end every text
    with its end token, keeping the tokens it puts first (Llama 3's BOS); an encoder's as it is. In place; safe to
    apply again."""
    if not is_decoder(config):
        return tokenizer
    end = end_token(tokenizer)
    if end is None:
        raise ValueError(f"{config.model_type} tokenizer has no EOS token to end texts with")
    end_id = tokenizer.convert_tokens_to_ids(end)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = end
    if tokenizer("a")["input_ids"][-1:] != [end_id]:
        if not tokenizer.is_fast:
            raise ValueError(f"{type(tokenizer).__name__}: a slow tokenizer cannot be made to append {end}")
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        first = tokenizer("a")["input_ids"][: -len(plain)]  # the special tokens it puts first (BOS), if any
        names = tokenizer.convert_ids_to_tokens(first)
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join([*names, "$A", end]), pair=" ".join([*names, "$A", end, "$B:1", f"{end}:1"]),
            special_tokens=sorted({*zip(names, first), (end, end_id)}))
    return tokenizer


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose `is_causal` flag transformers' attention kernels read."""
    return [m for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool) and m is not model]


def set_bidirectional(model: torch.nn.Module, bidirectional: bool) -> None:
    """Switch a decoder's attention between causal (its own) and bidirectional (every token sees every other)."""
    model.config.is_causal = not bidirectional
    for module in attention_modules(model):
        module.is_causal = not bidirectional


def loaded_attention(model: torch.nn.Module) -> None:
    """A loaded decoder's attention as its saved config says: transformers builds its modules causal whatever
    `is_causal` the config holds (it reads it for the mask only)."""
    if is_decoder(model.config) and not getattr(model.config, "is_causal", True):
        set_bidirectional(model, True)


def ready_transformer(transformer: torch.nn.Module) -> None:
    """A sentence-transformers Transformer module as embforge uses it: its tokenizer ready, a decoder's attention
    as its saved config says."""
    ready_tokenizer(transformer.tokenizer, transformer.auto_model.config)
    loaded_attention(transformer.auto_model)


def dropout_fields(config: PretrainedConfig) -> list[str]:
    """The fields of `config` that hold dropout probabilities: set at load, since modules read them when built."""
    return [f for f in DROPOUT_FIELDS if isinstance(getattr(config, f, None), float | int)]
