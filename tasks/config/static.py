"""Static embedding models (`static`): a token → vector table distilled from a model of the run
(tasks/static.py, docs/static.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.config.base import DEVICE_HELP, Device, Section


class StaticSettings(Section):
    """How a static model is made (the static stage's settings, part of its key)."""

    pca_dims: int | None = Field(256, ge=2, description="Dimensions kept by PCA (at most the teacher's); null "
                                 "keeps the teacher's.")
    sif_coefficient: float | None = Field(1e-4, gt=0, lt=1, description="Zipf (SIF) weighting of the tokens: "
                                          "frequent ones count less; null: no weighting.")
    corpus_words: int = Field(0, ge=0, description="Add up to this many of the corpus's most frequent words as "
                              "whole tokens (tokenlearn's vocabulary), each embedded by the teacher; 0: the "
                              "teacher's own vocabulary only.")
    tokenlearn: bool = Field(True, description="Train the distilled table on the teacher's vectors of the "
                             "corpus's sentences (tokenlearn): what adapts it to the corpus.")
    sentences: int = Field(100_000, ge=10, description="At most this many of the corpus's sentences are embedded "
                           "by the teacher for tokenlearn (the first ones, in corpus order).")
    dtype: Literal["float16", "float32"] = Field("float16", description="How the table is stored: float16 (half "
                                                 "the size; model2vec's default) or float32.")
    device: Device = Field("auto", description=DEVICE_HELP)


class StaticConfig(StaticSettings):
    of: list[str] = Field(min_length=1, description="The models to distil: method names, and `base` for the "
                          "run's untrained model (e.g. `[crops, base]`).")
    speed_documents: int = Field(256, ge=0, description="The report's CPU documents/s of each static model and its "
                                 "teacher, measured side by side on this many of the corpus's documents; 0: not "
                                 "measured.")
