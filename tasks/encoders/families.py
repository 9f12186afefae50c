"""A model of each family (tasks/config/families.py) as training builds it and as its folder loads.

A dense model is sentence-transformers' SentenceTransformer (tasks/encoders/models.py's `sentence_model`). A
multi-vector model keeps the same transformer, projects each token state to `dim` with a linear layer, drops
documents' punctuation from scoring (ColBERT's skiplist) and normalises every token vector: sentence-transformers'
MultiVectorEncoder with the modules its own fresh models get, so the saved folder loads there as it is. Its loss
(tasks/methods/objectives.py) is the library's MaxSim InfoNCE; scoring reads it by MaxSim (mteb's retrieval tasks)
or as its mean token vector (tasks/encoders/encode.py's TokenMeanEncoder).
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from sentence_transformers import MultiVectorEncoder, SentenceTransformer
from sentence_transformers.base.model import BaseModel
from sentence_transformers.base.modules import Normalize
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
from torch import nn

from tasks.config.base import InputError
from tasks.encoders import decoders
from tasks.encoders.models import load_model, resolve_model

if TYPE_CHECKING:  # the settings' module is the trainer's: what only embeds does not depend on it
    from tasks.config.training import MultiVectorSettings


def multi_vector_model(model: SentenceTransformer, settings: MultiVectorSettings, seed: int) -> MultiVectorEncoder:
    """`model`'s transformer as a multi-vector model: a projection to `settings.dim` drawn from `seed` (nn.Linear's
    own initialisation, from a generator of its own: the same weights whatever the process drew before), the
    scoring mask and the token vectors' normalisation."""
    transformer = model[0]
    with torch.device("meta"):  # built without weights, so nothing is drawn from torch's global generator
        projection = Dense(in_features=transformer.get_embedding_dimension(), out_features=settings.dim, bias=False,
                           activation_function=nn.Identity(), module_input_name="token_embeddings")
    projection.to_empty(device="cpu")  # drawn on the CPU: the same weights on any device
    nn.init.kaiming_uniform_(projection.linear.weight, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
    mask = MultiVectorMask(skiplist_words=list(string.punctuation) if settings.skip_punctuation else [])
    return MultiVectorEncoder(modules=[transformer, projection.to(model.device), mask,
                                       Normalize(module_input_name="token_embeddings")], device=str(model.device))


def sentence_vectors(model: BaseModel, texts: list[str], batch_size: int) -> torch.Tensor:
    """One vector per text, (texts, dim), for what compares texts by one vector (the health probe, the learning
    curve's kNN): a dense model's own, or the mean of a multi-vector model's scoring token vectors (as documents)."""
    if isinstance(model, MultiVectorEncoder):
        tokens = model.encode_document(texts, batch_size=batch_size, show_progress_bar=False)  # (tokens_i, dim) each
        return torch.stack([t.float().mean(0) for t in tokens])
    return model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)


def is_multi_vector(name_or_path: str) -> bool:
    """Whether a model folder holds a multi-vector model (sentence-transformers' MultiVectorEncoder)."""
    config = Path(resolve_model(name_or_path)) / "config_sentence_transformers.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == MultiVectorEncoder.model_type


def load_multi_vector(name_or_path: str, device: str, **kwargs) -> MultiVectorEncoder:
    """A saved multi-vector model as scoring reads it: a decoder's attention as it trained (bidirectional or not)."""
    model = load_model(name_or_path, lambda p: MultiVectorEncoder(p, device=device, **kwargs))
    decoders.ready_transformer(model[0])
    return model


def dense_only(name_or_path: str, what: str) -> None:
    """An InputError where `what` would read a multi-vector model as a dense one: its backbone's token states pooled,
    without the projection it trained."""
    if is_multi_vector(name_or_path):
        raise InputError(f"{name_or_path}: a multi-vector model (MultiVectorEncoder), which {what} cannot read; "
                         "encode.encoder_at reads it as its mean token vector")
