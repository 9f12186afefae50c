"""Text tokens: a text set's token ids for embedding, computed once and stored, so that the embed stage only pads
them (tasks/encoders/encode.py). Every model with the same tokenizer reads them: a run's base model (or random
encoder, which is given its tokenizer) and each model the run trains from it (training keeps the tokenizer), a
reference model of the same name, and every later evaluation of them.

Key: the text set (tasks/encoders/text_sets.py), the tokenizer's model (its name, and its files if local), the
max length and the prompt put before every text (model.prompts: the query one for queries, else the document
one). Inputs: the text set's (`documents` or `held_out_queries`); `model`, the artifact holding the tokenizer,
for a model known by its artifact alone (registered without its tokenizer's name).
Output `tokens.parquet`: one row per text, in the text set's order, `text` its ids as the evaluation encoder
makes them (cut to the character budget, special tokens in, truncated to max_length, unpadded; list<int32>),
a row group per chunk of texts. The manifest gives the ids' length statistics, the texts cut to the character
budget, and the tokenizer's digest, which the embed stage checks against its encoder's.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pydantic import Field
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from storage.base import ArtifactRef
from storage.store import ArtifactStore, ArtifactWriter
from tasks.core import duck
from tasks.core.progress import StageProgress
from tasks.core.stage import Stage
from tasks.encoders.budget import char_budget, over_budget
from tasks.encoders.inputs import IDS, encoder_tokenize, prompted, text_chunks, tokenizer_digest, unknown_tokens
from tasks.encoders.models import load_tokenizer
from tasks.encoders.text_sets import TextSet, TextSetInputs, read_texts, text_set_identity

SCHEMA = pa.schema([("text", IDS)])


class TextTokensJob(TextSet):
    max_length: int
    prompt: str = Field("", description="Put before every text (model.prompts).")


def text_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int) -> pa.Array:
    """`texts`' ids as the evaluation encoder makes them, unpadded (one chunk of the stage's column)."""
    return pa.array(encoder_tokenize(tokenizer, texts, max_length, padded=False)["input_ids"], IDS)


def build_text_tokens(store: ArtifactStore, job: TextTokensJob, inputs: TextSetInputs,
                      out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    texts = read_texts(store, job, inputs)
    tokenizer = load_tokenizer(inputs.model_location(store, job.model))
    with StageProgress(len(texts), "texts") as progress, \
            tqdm(total=len(texts), desc=progress.label, unit="text", mininterval=5) as bar:
        def tables():
            for chunk in text_chunks(texts):
                ids = text_ids(tokenizer, prompted(chunk, job.prompt), job.max_length)
                progress.advance(len(chunk))
                bar.update(len(chunk))
                yield pa.table({"text": ids}, schema=SCHEMA)
        out.write_batches("tokens", SCHEMA, tables())
    lengths = duck.length_stats(out.folder / "tokens.parquet", ["text"], job.max_length, out.work,
                                tokenizer.unk_token_id)["text"]
    cut = over_budget(prompted(texts, job.prompt), job.max_length)
    out.extra.update(tokenizer=tokenizer_digest(tokenizer, job.max_length), max_length=job.max_length,
                     texts=len(texts), cut=cut, lengths=lengths)
    if texts:
        log.info("%d texts, %.1f tokens on average, %d at most, %.1f%% at the max length %d%s", len(texts),
                 lengths["mean"], lengths["max"], 100 * lengths["at_max_length"], job.max_length,
                 f"; {cut} over {char_budget(job.max_length):,} characters cut to that first" if cut else "")
    if said := unknown_tokens(f"{len(texts)} texts", lengths["unknown"], tokenizer):
        log.warning(said)


TEXT_TOKENS = Stage("text_tokens", build_text_tokens, extra_key=text_set_identity)
