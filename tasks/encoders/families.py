"""A model of each family (tasks/config/families.py) as training builds it and as its folder loads.

A dense model is sentence-transformers' SentenceTransformer (tasks/encoders/models.py's `sentence_model`). A
multi-vector model keeps the same transformer, projects each token state to `dim` with a linear layer, drops
documents' punctuation from scoring (ColBERT's skiplist) and normalises every token vector: sentence-transformers'
MultiVectorEncoder with the modules its own fresh models get, so the saved folder loads there as it is. Its loss
(tasks/methods/objectives.py) is the library's MaxSim InfoNCE; scoring reads it by MaxSim (mteb's retrieval tasks)
or as its mean token vector (tasks/encoders/encode.py's TokenMeanEncoder). A sparse model keeps the dense model whole
and adds CSR's sparse autoencoder on its vector (sentence-transformers' SparseEncoder of SparseAutoEncoder): a text
is its top `active_dims` codes; its loss is the library's CSR loss; scoring reads the codes as one vector a text, a
query meeting a document by their dot product (encode.py's SparseCodeEncoder). A SPLADE model (the sparse family's
other kind) is the base's transformer with its masked-LM head and SPLADE's pooling: a text is a weight for each
vocabulary term, its loss the library's SPLADE loss (InfoNCE and the FLOPS regularisers).
"""

from __future__ import annotations

import json
import logging
import math
import string
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file
from sentence_transformers import MultiVectorEncoder, SentenceTransformer
from sentence_transformers.base.model import BaseModel
from sentence_transformers.base.modules import Normalize
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
from sentence_transformers.sparse_encoder import SparseEncoder
from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder, SpladePooling
from sentence_transformers.util import load_file_path
from torch import nn
from transformers import AutoConfig, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel

from tasks.config.base import InputError
from tasks.encoders import decoders
from tasks.encoders.models import MODEL_LOADING, load_model, resolve_model, training_transformer

if TYPE_CHECKING:  # the settings' module is the trainer's: what only embeds does not depend on it
    from tasks.config.family_settings import MultiVectorSettings, SparseSettings

# The class each family's folder loads with (sentence-transformers' own: its `model_type` names the family).
MODEL_CLASSES: dict[str, type[BaseModel]] = {"dense": SentenceTransformer, "multi_vector": MultiVectorEncoder,
                                             "sparse": SparseEncoder}


def multi_vector_model(model: SentenceTransformer, settings: MultiVectorSettings, seed: int) -> MultiVectorEncoder:
    """`model`'s transformer as a multi-vector model: a projection to `settings.dim` drawn from `seed` (nn.Linear's
    own initialisation, from a generator of its own: the same weights whatever the process drew before), the
    scoring mask and the token vectors' normalisation; queries expanded as `settings.query_expansion` says."""
    transformer = model[0]
    with torch.device("meta"):  # built without weights, so nothing is drawn from torch's global generator
        projection = Dense(in_features=transformer.get_embedding_dimension(), out_features=settings.dim, bias=False,
                           activation_function=nn.Identity(), module_input_name="token_embeddings")
    projection.to_empty(device="cpu")  # drawn on the CPU: the same weights on any device
    nn.init.kaiming_uniform_(projection.linear.weight, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
    if settings.query_expansion:  # saved with the model: its encode_query widens queries the same way
        transformer.query_expansion = {"strategy": "min", "length": settings.query_expansion, "attend": False}
    mask = MultiVectorMask(skiplist_words=list(string.punctuation) if settings.skip_punctuation else [])
    return MultiVectorEncoder(modules=[transformer, projection.to(model.device), mask,
                                       Normalize(module_input_name="token_embeddings")], device=str(model.device))


def sparse_model(model: SentenceTransformer, settings: SparseSettings, seed: int) -> SparseEncoder:
    """`model` whole (transformer and pooling) with CSR's sparse autoencoder on its unit vector: `settings.width`
    codes, the top `settings.active_dims` kept, its weights drawn from `seed` (the same whatever the process drew
    before; training starts them from its texts: `start_codes`)."""
    dim = model.get_embedding_dimension()
    width = settings.resolved_width(dim)
    if settings.min_width > width:  # CSR's loss also reconstructs the vector from its top 4k codes
        top = settings.min_width // settings.active_dims
        raise InputError(f"sparse.active_dims: {settings.active_dims}, but CSR's loss reconstructs from the top "
                         f"{top} x {settings.active_dims} of {width} codes (sparse.width, default 4 x the base's "
                         f"{dim}); set sparse.width to at least {settings.min_width} or active_dims to at most "
                         f"{width // top}")
    with torch.random.fork_rng(devices=[]):  # drawn on the CPU from the seed, the process's generators left alone
        torch.default_generator.manual_seed(seed)
        autoencoder = SparseAutoEncoder(input_dim=dim, hidden_dim=width, k=settings.active_dims,
                                        k_aux=min(settings.aux_dims, width))
    # the autoencoder reads the unit vector: the geometry the dense model's cosine compares
    return SparseEncoder(modules=[*model, Normalize(), autoencoder.to(model.device)], device=str(model.device))


def splade_model(path: str, settings: SparseSettings, max_length: int, device: str, seed: int,
                 layer: int | None = None, dropout: float | None = None) -> SparseEncoder:
    """The masked-LM encoder at `path` as a SPLADE model: its head's logits over the vocabulary, log(1 + ReLU), the
    maximum over the text's tokens (sentence-transformers' SpladePooling), at most `settings.active_dims` kept where
    a text is encoded. Its head: the one an mlm method trained beside the model at `path` (MLM_HEAD), else the
    checkpoint's; one the checkpoint lacks (a sentence encoder's) is drawn from `seed`, with a warning."""
    config = load_model(path, AutoConfig.from_pretrained)
    check_masked_lm(path, config)
    # a missing head drawn on the CPU from the seed, the process's generators left alone
    with MODEL_LOADING, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        transformer = training_transformer(path, max_length, layer, dropout=dropout, task="fill-mask")
        trained = load_head(transformer.auto_model, path)
        untrained = set() if trained else untrained_head(path)  # its load draws a missing head too
    if untrained:
        logging.getLogger(__name__).warning(
            "%s: its checkpoint has no trained masked-LM head (%d tensors missing, e.g. %s): SPLADE's term weights "
            "start from a random head; a base that has one (BERT, DistilBERT, a SPLADE checkpoint), or an mlm "
            "method's model (`start_from`), starts from what its head knows",
            path, len(untrained), sorted(untrained)[0])
    pooling = SpladePooling("max", embedding_dimension=config.vocab_size)
    return SparseEncoder(modules=[transformer, pooling], max_active_dims=settings.active_dims, device=device)


MLM_HEAD = "mlm_head.safetensors"  # beside a saved model: the masked-LM head its encoder trained with (the mlm recipe)


def masked_lm_part(model: PreTrainedModel) -> nn.Module:
    """A masked-LM model's head: its one child with weights that is not its base model (BERT: `cls`, RoBERTa:
    `lm_head`)."""
    rest = [m for name, m in model.named_children()
            if name != model.base_model_prefix and next(m.parameters(), None) is not None]
    if len(rest) != 1:
        raise ValueError(f"{type(model).__name__}: cannot tell its masked-LM head apart ({len(rest)} candidates)")
    return rest[0]


def save_head(head: nn.Module, embeddings: torch.Tensor, folder: Path) -> None:
    """`head`'s own tensors as `folder`/MLM_HEAD: not its output projection, which is the encoder's word `embeddings`
    (saved with the model); copies, so the tied biases are two tensors as safetensors wants."""
    own = {name: tensor.detach().to("cpu").clone() for name, tensor in head.state_dict().items()
           if tensor.data_ptr() != embeddings.data_ptr()}
    save_file(own, str(folder / MLM_HEAD))


def load_head(masked_lm: PreTrainedModel, folder: str) -> bool:
    """Into `masked_lm`'s head, the one that `save_head` saved in `folder`, its output projection tied to the word
    embeddings as the mlm method trained it; False where there is none."""
    file = Path(folder) / MLM_HEAD
    if not file.is_file():
        return False
    embeddings = masked_lm.get_input_embeddings().weight
    masked_lm.get_output_embeddings().weight = embeddings
    head = masked_lm_part(masked_lm)
    tied = {name for name, tensor in head.state_dict().items() if tensor.data_ptr() == embeddings.data_ptr()}
    try:
        missing, unexpected = head.load_state_dict(load_safetensors(str(file)), strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise InputError(f"{file}: not this model's masked-LM head ({e})") from None
    if set(missing) != tied or unexpected:
        raise InputError(f"{file}: not this model's masked-LM head (missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)})")
    return True


def check_masked_lm(path: str, config: PretrainedConfig) -> None:
    """An InputError where transformers has no masked-LM head for the model at `path` (a decoder LLM's)."""
    if type(config) not in AutoModelForMaskedLM._model_mapping:
        raise InputError(f"{path}: SPLADE (sparse.kind) reads term weights from a masked-LM head, and transformers has "
                         f"none for a {config.model_type} model; use sparse.kind csr")


def untrained_head(path: str) -> set[str]:
    """The masked-LM head tensors the checkpoint at `path` lacks (transformers' own account of its loading)."""
    _, info = load_model(path, lambda p: AutoModelForMaskedLM.from_pretrained(p, output_loading_info=True))
    return set(info["missing_keys"])


def start_codes(model: SparseEncoder, texts: list[str], batch_size: int, seed: int) -> None:
    """Start the autoencoder's encoder from `texts`: its rows the principal directions of their unit vectors, each
    with both signs, then random orthonormal directions (from `seed`) with both signs, in that order up to its
    width; its input bias zero. Its top-k codes then start as the largest coordinates of a text's unit vector in that
    basis, so their dot product starts near the dense model's cosine (SciFact, untrained MiniLM, 256 of 1,536 codes:
    nDCG@10 0.712 from 256 texts, 0.720 from 1,024, the dense model's 0.736; a random start keeps 0.686, and the
    budget of a fine-tuning run hardly moves it: docs/families.md)."""
    dense = SentenceTransformer(modules=list(model)[:-1], device=str(model.device))  # the same modules, shared
    vectors = dense.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    model.train()
    autoencoder = model[-1]
    width, dim = autoencoder.encoder.weight.shape
    principal = np.linalg.svd(vectors.astype(np.float64), full_matrices=True)[2]  # (dim, dim), strongest first
    rng = np.random.default_rng(seed)
    bases = [principal] + [np.linalg.qr(rng.standard_normal((dim, dim)))[0].T
                           for _ in range(math.ceil(width / (2 * dim)) - 1)]
    rows = np.concatenate([signed for basis in bases for signed in (basis, -basis)])[:width]  # (width, dim)
    with torch.no_grad():
        autoencoder.encoder.weight.copy_(torch.from_numpy(rows))
        autoencoder.pre_bias.zero_()


def sentence_vectors(model: BaseModel, texts: list[str], batch_size: int) -> torch.Tensor:
    """One vector per text, (texts, dim), for what compares texts by one vector (the health probe, the learning
    curve's kNN): a dense model's own, the mean of a multi-vector model's scoring token vectors (as documents), or a
    sparse model's codes (zeros included)."""
    if isinstance(model, MultiVectorEncoder):
        tokens = model.encode_document(texts, batch_size=batch_size, show_progress_bar=False)  # (tokens_i, dim) each
        return torch.stack([t.float().mean(0) for t in tokens])
    if isinstance(model, SparseEncoder):
        return model.encode(texts, batch_size=batch_size, convert_to_sparse_tensor=False, show_progress_bar=False)
    return model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)


# The model type PyLate (up to v3) wrote for its ColBERT checkpoints, and the architecture a Stanford ColBERT
# checkpoint's config.json names: MultiVectorEncoder loads both (its `_get_model_type` reads them the same way).
PYLATE_MODEL_TYPE, STANFORD_ARCHITECTURE = "ColBERT", "HF_ColBERT"


def family_of(name_or_path: str) -> str:
    """The family of a saved model, a local folder or a Hub repository: by the class its sentence-transformers config
    names (PyLate's ColBERT too), else a multi-vector one where its config.json is a Stanford ColBERT's; dense where it
    is neither, or where its configs cannot be read (a Hub name offline and not cached, the Hub unreachable)."""
    folder = resolve_model(name_or_path)
    return (saved_family(folder) or "dense") if Path(folder).is_dir() else hub_family(folder)


HUB_FAMILIES: dict[str, str] = {}  # a Hub repository's family, once its configs were read: asked once a process


def hub_family(repo_id: str) -> str:
    if known := HUB_FAMILIES.get(repo_id):
        return known
    try:
        family = saved_family(repo_id)
    except Exception as e:  # noqa: BLE001 (the Hub's network, auth and proxy errors)
        family, why = None, str(e)
    else:
        why = "neither config is in the repository, or the Hub cannot be reached and they are not cached"
    if family is None:  # not kept: the next ask may reach the Hub
        logging.getLogger(__name__).warning("%s: its family cannot be read from the Hub (%s): read as dense",
                                            repo_id, why)
        return "dense"
    HUB_FAMILIES[repo_id] = family
    return family


def saved_family(name_or_path: str) -> str | None:
    """family_of a folder or Hub repository from its configs (sentence-transformers' library reads them: local, or
    fetched and cached); None where it has neither config.json nor config_sentence_transformers.json."""
    config = load_file_path(name_or_path, "config_sentence_transformers.json")
    hf_config = None if config else load_file_path(name_or_path, "config.json")
    if config is None and hf_config is None:
        return None
    model_type = json.loads(Path(config).read_text()).get("model_type") if config else None
    architectures = json.loads(Path(hf_config).read_text()).get("architectures") or [] if hf_config else []
    if model_type == PYLATE_MODEL_TYPE or STANFORD_ARCHITECTURE in architectures:
        return "multi_vector"
    return next((f for f, cls in MODEL_CLASSES.items() if f != "dense" and cls.model_type == model_type), "dense")


def load_saved(name_or_path: str, device: str, **kwargs) -> BaseModel:
    """A saved model as scoring reads it, in the class of its family (a decoder's attention as it trained,
    bidirectional or not)."""
    cls = MODEL_CLASSES[family_of(name_or_path)]
    model = load_model(name_or_path, lambda p: cls(p, device=device, **kwargs))
    decoders.ready_transformer(model[0])
    return model


def dense_only(name_or_path: str, what: str) -> None:
    """An InputError where `what` would read a model of another family as a dense one: its backbone's token states
    pooled, without the head it trained."""
    if (family := family_of(name_or_path)) != "dense":
        raise InputError(f"{name_or_path}: a {family} model ({MODEL_CLASSES[family].__name__}), which {what} cannot "
                         "read; encode.encoder_at reads it as one vector a text")
