"""A model's inputs for a batch of one column: from texts, tokenized now, or from the token ids the
tokens stages stored once (tasks/tokens.py for training, tasks/text_tokens.py for embedding), padded now. Both
give the same tensors.

A text is cut to the character budget of the model's max length before it is tokenized
(tasks/encoders/budget.py); the ids are then truncated to the max length, with special tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from sentence_transformers import SentenceTransformer
from transformers import PreTrainedTokenizerBase

from tasks.encoders.budget import cut_texts
from tasks.encoders.models import pad_multiple, token_arrays

NO_WORD = -1  # the word of a special or padding token
TEXT_COLUMNS = ("anchor", "positive", "negative")  # a pairs row's texts (tasks/pairs.py), as the tokens stage's ids
LABEL_COLUMNS = ("margin",)  # a pairs row's values for the loss (GPL's teacher margin), kept as they are
IDS = pa.list_(pa.int32())  # a text's token ids as the tokens stages store them
TOKENIZE_CHUNK = 2_048  # texts a tokens stage tokenizes at once (65,536 held 3.6 GiB more; 2,048: 114 MiB)


def words_column(column: str) -> str:
    """A tokens file's column of the words of `column`'s ids."""
    return f"{column}_words"


class Tokens(NamedTuple):
    """One text as the tokens stage stored it: its ids, unpadded, and for whole-word masking each id's
    word (NO_WORD on special tokens)."""

    ids: np.ndarray  # (tokens,) int32
    words: np.ndarray | None = None  # (tokens,) int32


def prompted(texts: list[str], prompt: str) -> list[str]:
    """`texts` each after `prompt` (model.prompts), as sentence-transformers' `encode(prompt=...)` reads them: the
    prompt is cut with the text to the character budget and tokenized with it."""
    return [prompt + text for text in texts] if prompt else texts


def tokenizer_digest(tokenizer: PreTrainedTokenizerBase, max_length: int, lower_case: bool = False) -> str:
    """What decides a text's ids: the tokenizer's definition (vocabulary, normalizer, special tokens, not the
    truncation and padding a call last set), the max length, and the lowercasing sentence-transformers may add."""
    if tokenizer.is_fast:
        spec = {k: v for k, v in json.loads(tokenizer.backend_tokenizer.to_str()).items()
                if k not in ("truncation", "padding")}
    else:
        spec = [tokenizer.get_vocab(), tokenizer.special_tokens_map]
    return hashlib.sha256(json.dumps([spec, lower_case, max_length], sort_keys=True).encode()).hexdigest()[:16]


MOSTLY_UNKNOWN = 0.5  # a text column whose ids are this share the unknown token: the tokenizer cannot read it


def unknown_tokens(what: str, share: float | None, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A warning when most of a text column's tokens are the tokenizer's unknown one (None: they are not)."""
    if share is None or share < MOSTLY_UNKNOWN:
        return None
    return (f"{what}: {share:.0%} of the tokens are {tokenizer.unk_token}: the tokenizer does not know these texts' "
            "characters (emoji, another script?), so their embeddings can tell them little apart")


def model_tokenizer_digest(model: SentenceTransformer) -> str:
    """tokenizer_digest of what a training step's texts go through: the model's tokenizer, its max length and
    lowercasing."""
    return tokenizer_digest(model.tokenizer, model.max_seq_length, getattr(model[0], "do_lower_case", False))


def tokenize(model: SentenceTransformer, texts: list[str], padded: bool = True) -> dict:
    """The model's inputs for `texts` as sentence-transformers makes them (padded: to the batch's longest,
    or to a compiled model's multiple); unpadded, `input_ids` is one list per text."""
    text = {"pad_to_multiple_of": pad_multiple(model)} if padded else {"padding": False}
    encoded = model.preprocess(cut_texts(texts, model.max_seq_length),
                               processing_kwargs={"text": text, "common": {"return_tensors": None}})
    return token_arrays(encoded) if padded else encoded


def encoder_tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int, padded: bool = True,
                     ) -> dict:
    """An evaluation encoder's inputs for `texts` (tasks/encoders/encode.py): the tokenizer's own call, padded
    to the longest (lists), or unpadded."""
    return tokenizer(cut_texts(texts, max_length), padding=padded, truncation=True, max_length=max_length)


def text_chunks(texts: list[str]) -> Iterator[list[str]]:
    """`texts`, TOKENIZE_CHUNK at a time: what a tokens stage hands its tokenizer at once."""
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        yield texts[start : start + TOKENIZE_CHUNK]


def word_tokenize(model: SentenceTransformer, texts: list[str], padded: bool = True) -> dict:
    """The tokenizer's inputs for `texts` plus `word_ids` (NO_WORD on special and padding tokens), for
    whole-word masking; unpadded, lists."""
    batch = model.tokenizer(cut_texts(texts, model.max_seq_length), padding=padded, truncation=True,
                            max_length=model.max_seq_length, pad_to_multiple_of=pad_multiple(model) if padded else None)
    words = [[NO_WORD if w is None else w for w in batch.word_ids(i)] for i in range(len(texts))]
    return token_arrays({**batch, "word_ids": words}) if padded else {**batch, "word_ids": words}


def padded(rows: list[np.ndarray], value: int, multiple: int | None, left: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rows, width) int64: each row's values, then `value` (before them with `left`); width = the longest
    row, rounded up to `multiple`. And (rows, width) bool: where the row's own values are."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    width = int(lengths.max())
    if multiple:
        width = -(-width // multiple) * multiple
    slots = np.arange(width)
    real = slots >= width - lengths[:, None] if left else slots < lengths[:, None]  # (rows, width)
    out = np.full((len(rows), width), value, np.int64)
    out[real] = np.concatenate(rows)  # row-major: each row's values in order
    return out, real


def padded_ids(tokenizer: PreTrainedTokenizerBase, rows: list[Tokens], multiple: int | None = None) -> dict:
    """Stored ids padded as `tokenizer` pads the texts they came from (to the longest row, rounded up to
    `multiple`): NumPy int64 arrays of its input names. A single text's token types are all 0."""
    ids, real = padded([r.ids for r in rows], tokenizer.pad_token_id, multiple, tokenizer.padding_side == "left")
    names = tokenizer.model_input_names
    arrays = {"input_ids": ids}
    if "token_type_ids" in names:
        arrays["token_type_ids"] = np.where(real, 0, tokenizer.pad_token_type_id)
    if "attention_mask" in names:
        arrays["attention_mask"] = real.astype(np.int64)
    return arrays


def padded_tokens(model: SentenceTransformer, rows: list[Tokens], words: bool = False) -> dict:
    """Stored ids padded as `tokenize` (with `words`: as `word_tokenize`) pads the texts they came from."""
    tokenizer, multiple = model.tokenizer, pad_multiple(model)
    arrays = padded_ids(tokenizer, rows, multiple)
    if words:
        if rows[0].words is None:
            raise ValueError("whole-word masking needs each token's word: tokens stored with word_ids")
        arrays["word_ids"] = padded([r.words for r in rows], NO_WORD, multiple, tokenizer.padding_side == "left")[0]
    return {**token_arrays(arrays), **({} if words else {"modality": "text"})}


def features(model: SentenceTransformer, column: list[str] | list[Tokens], task: str | None = None) -> dict:
    """The model's inputs for a batch's column: its texts tokenized, or its stored ids padded; read as `task` (a
    multi-vector model's "query" or "document"): queries expanded where the model says (`expanded_queries`)."""
    if not column:
        return {}
    arrays = padded_tokens(model, column) if isinstance(column[0], Tokens) else tokenize(model, column)
    return expanded_queries(model, arrays) if task == "query" else arrays


def expanded_queries(model: SentenceTransformer, arrays: dict) -> dict:
    """A batch of queries widened as ColBERT does, where the model's transformer module has a `query_expansion`
    (sentence-transformers' `min` strategy, the one embforge sets: tasks/encoders/families.py): at least `length`
    tokens wide, every slot within them past a query's own tokens the mask token, marked in
    `query_expansion_positions` so that MaxSim scores it, and attended to only with `attend`. Else `arrays`."""
    expansion = getattr(model[0], "query_expansion", None)
    if expansion is None:
        return arrays
    ids, mask = arrays["input_ids"], arrays["attention_mask"]  # (rows, width)
    widen = lambda t: torch.nn.functional.pad(t, (0, max(0, expansion["length"] - t.shape[1])))  # noqa: E731
    ids, mask = widen(ids), widen(mask)  # (rows, max(width, length))
    slots = (mask == 0) & (torch.arange(ids.shape[1]) < expansion["length"])  # (rows, width): the expansion's
    token = expansion["token"] or model.tokenizer.mask_token or model.tokenizer.eos_token  # PyLate's fallback
    widened = {**arrays, "input_ids": ids.masked_fill(slots, model.tokenizer.convert_tokens_to_ids(token)),
               "attention_mask": mask.masked_fill(slots, 1) if expansion["attend"] else mask,
               "query_expansion_positions": slots}
    if "token_type_ids" in arrays:
        widened["token_type_ids"] = widen(arrays["token_type_ids"])
    return widened


def column_values(rows: pa.Table, column: str) -> list:
    """A column's value in each row: texts and margins as they are, token ids as Tokens (with their words)."""
    values = rows[column]
    if not pa.types.is_list(values.type) or not len(values):
        return values.to_pylist()
    cuts = np.cumsum(pc.list_value_length(values).to_numpy())[:-1]
    ids = np.split(pc.list_flatten(values).to_numpy(), cuts)
    if words_column(column) not in rows.column_names:
        return [Tokens(i) for i in ids]
    return [Tokens(*t) for t in zip(ids, np.split(pc.list_flatten(rows[words_column(column)]).to_numpy(), cuts))]
