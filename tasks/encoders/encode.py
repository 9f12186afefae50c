"""Evaluation encoding: raw (not normalised) pooled embeddings, as the papers measure them.

Loads any model folder or Hub name through `AutoModel.from_pretrained` (or runs it exported, on
ONNX Runtime or OpenVINO: tasks/encoders/backends.py) and pools token states itself, so the model's own
head (e.g. a Normalize module) does not change the metric. Pooling is mean (the papers' default)
or the token a recipe trained: CLS (first) or SEP (the last real one: a decoder's appended EOS).
`encode_layers` gives every hidden layer and every pooling from one forward pass, which is what
the embeddings cache stores (layer 0 = the embedding layer); `encode_chunks` gives the same a
chunk of texts at a time, so a corpus of any size is encoded in bounded memory. A static model
(tasks/static.py) is encoded through model2vec instead (`StaticEncoder`), a multi-vector or sparse model
(tasks/encoders/families.py) through sentence-transformers (`TokenMeanEncoder`, `SparseCodeEncoder`); `encoder_at`
picks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from scipy import sparse
from sentence_transformers.util import select_max_active_dims
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel

from tasks.config.base import InputError
from tasks.core.prefetch import prefetched
from tasks.core.progress import StageProgress
from tasks.encoders import backends, decoders, families, precision
from tasks.encoders.inputs import Tokens, encoder_tokenize, features, padded_ids
from tasks.encoders.models import load_model, load_tokenizer, pick_device, resolve_model, to_device, token_arrays

POOLINGS = ("mean", "cls", "sep")
# Encoders whose forward only turns the 2-D attention mask into SDPA's (transformers' create_bidirectional_mask):
# given that mask ready, as MODEL_MASK, they skip the check for padding that reads the mask back from the device.
HOST_MASKED = ("bert",)
MODEL_MASK = "model_attention_mask"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "sep":  # the last real token, whichever side the padding is on
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)
        return hidden[torch.arange(len(hidden), device=hidden.device), last]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


class Encoder:
    """What the embed, semantic and static stages encode with: `encode_chunks` gives (positions, vectors of shape
    (len(layers), len(POOLINGS), len(positions), dim)); `tokenizer` made the ids it takes instead of texts (None:
    it tokenizes texts itself)."""

    pooling: str
    tokenizer = None
    dtype: torch.dtype | None = None  # what it computes in, where embforge chooses it (not a static model's)
    token_mean = False  # its one vector is a multi-vector model's mean token vector, not what it retrieves by
    similarity = "cosine"  # how a query's vector meets a document's in retrieval (a sparse model's: "dot")
    family = "dense"  # the model's family (tasks/config/families.py)
    n_layers: int
    dim: int

    def encode_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None, chunk: int | None = None,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError

    def encode_layers(self, texts: list[str], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None) -> np.ndarray:
        """Embeddings of shape (len(layers), len(POOLINGS), len(texts), dim); layers default to the last."""
        layers = [self.n_layers] if layers is None else layers
        out = np.empty((len(layers), len(POOLINGS), len(texts), self.dim), dtype=np.float32)
        for positions, emb in self.encode_chunks(texts, max_length, batch_size, layers):
            out[:, :, positions] = emb
        return out

    def encode(self, texts: list[str], max_length: int = 256, batch_size: int = 32) -> np.ndarray:
        """Last layer, this encoder's pooling."""
        return self.encode_layers(texts, max_length, batch_size)[0, POOLINGS.index(self.pooling)]


def is_static(model: str) -> bool:
    """Whether a model folder holds a static embedding model (model2vec's format: tasks/static.py)."""
    config = Path(resolve_model(model)) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == "model2vec"


def encoder_at(model: str, device: str = "auto", pooling: str = "mean", dtype: str = "fp32",
               backend: str = "torch") -> Encoder:
    """The encoder of a model folder or name: a static model's, a multi-vector or sparse model's, or a
    transformer's."""
    if is_static(model):
        return StaticEncoder(model)
    if (family := families.family_of(model)) != "dense":
        if backend != "torch":
            raise InputError(f"{model}: a {family} model runs on torch here, not on {backend} (evaluate.backend)")
        return (TokenMeanEncoder if family == "multi_vector" else SparseCodeEncoder)(model, device, dtype)
    return PooledEncoder(model, device, pooling, dtype, backend)


class StaticEncoder(Encoder):
    """A static model: each text's vector is its tokens' rows pooled as the model says (model2vec's `encode`,
    which tokenizes the texts itself). It has no hidden layers (layer 0) and one vector per text, which every
    POOLINGS column holds: the report reads it as mean pooling."""

    pooling, n_layers = "mean", 0

    def __init__(self, model: str):
        from model2vec import StaticModel

        self.model = load_model(model, StaticModel.from_pretrained)
        self.dim = self.model.dim

    def encode_chunks(self, texts: list[str], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None, chunk: int | None = None,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if (layers or [0]) != [0]:
            raise ValueError(f"a static model has one layer (0), not layers {layers}")
        chunk = chunk or max(1, len(texts))
        with StageProgress(len(texts), "texts") as progress:
            for start in range(0, len(texts), chunk):
                part = texts[start : start + chunk]
                # a batch of table lookups costs next to nothing: at least model2vec's own default of 1,024
                vectors = self.model.encode(part, max_length=max_length, batch_size=max(batch_size, 1024))
                progress.advance(len(part))
                # (1 layer, POOLINGS, texts, dim): the one vector under every pooling
                yield np.arange(start, start + len(part)), np.broadcast_to(vectors, (1, len(POOLINGS), *vectors.shape))


class FamilyEncoder(Encoder):
    """A saved model of a family other than dense (tasks/encoders/families.py) as sentence-transformers loads it, its
    modules run as they are: it gives its last layer only."""

    def __init__(self, model: str, device: str = "auto", dtype: str = "fp32"):
        self.model = families.load_saved(model, pick_device(device)).eval()
        self.tokenizer = self.model.tokenizer
        self.dtype = precision.autocast_dtype(dtype, self.model.device)
        self.n_layers = self.model[0].auto_model.config.num_hidden_layers
        self.dim = self.model.get_embedding_dimension()

    def last_layer_only(self, layers: list[int] | None) -> None:
        if (layers or [self.n_layers]) != [self.n_layers]:
            raise InputError(f"a {self.family} model gives its last layer ({self.n_layers}) only, not layers {layers} "
                             "(evaluate.layerwise)")


class TokenMeanEncoder(FamilyEncoder):
    """A multi-vector model read as one vector a text, for what compares texts by one vector (kNN, clustering, STS,
    geometry): the mean of its scoring token vectors as a document (punctuation left out), under every POOLINGS
    column. Its last layer only. Its own retrieval is MaxSim over the token vectors themselves (`token_chunks`; mteb's
    retrieval tasks), not this vector's cosine."""

    pooling, token_mean, family = "mean", True, "multi_vector"

    def encode_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None, chunk: int | None = None,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.last_layer_only(layers)
        chunks = self.token_chunks(texts, max_length, batch_size, chunk, keep_tokens=False)
        return ((positions, vectors) for positions, vectors, _ in chunks)

    def token_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                     chunk: int | None = None, task: str = "document", keep_tokens: bool = True,
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
        """encode_chunks' (positions, vectors), the texts read as `task` (`query`: every token scores; `document`:
        punctuation left out), and each text's scoring token vectors, (tokens_i, dim) (none without
        `keep_tokens`: they are not copied from the device)."""
        self.model.max_seq_length = max_length
        chunk = chunk or max(1, len(texts))
        with StageProgress(len(texts), "texts") as progress:
            for start in range(0, len(texts), chunk):
                part = texts[start : start + chunk]
                done = [self._vectors(part[i : i + batch_size], task, keep_tokens)
                        for i in range(0, len(part), batch_size)]
                means = np.concatenate([m for m, _ in done])
                progress.advance(len(part))
                yield (np.arange(start, start + len(part)), np.broadcast_to(means, (1, len(POOLINGS), *means.shape)),
                       [t for _, tokens in done for t in tokens])

    def _vectors(self, texts: list[str] | list[Tokens], task: str, keep_tokens: bool,
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(texts, dim) mean token vectors and (with `keep_tokens`) each text's scoring token vectors, the texts
        (stored ids padded, or texts tokenized) read as `task`."""
        with torch.inference_mode(), precision.autocast(self.model.device, self.dtype):
            out = self.model(to_device(features(self.model, texts, task), self.model.device), task=task)
        tokens, mask = out["token_embeddings"].float(), out["attention_mask"]  # (texts, width, dim), (texts, width)
        means = pool(tokens, mask, "mean").cpu().numpy()
        if not keep_tokens:
            return means, []
        kept = mask.bool().cpu().numpy()
        return means, [v[k] for v, k in zip(tokens.cpu().numpy(), kept)]


class SparseCodeEncoder(FamilyEncoder):
    """A sparse model (CSR's codes over a dense model's vector, or SPLADE's term weights: tasks/encoders/families.py)
    read as one vector a text: its `dim` codes, at most the model's `max_active_dims` of them active (what its
    `encode` keeps); its last layer only. `sparse_chunks` gives them as sparse rows (what the embed stage stores),
    `encode_chunks` zeros included under every POOLINGS column. It retrieves by their dot product (`similarity`);
    what compares texts by cosine (kNN, clustering, STS, geometry) reads the same codes."""

    pooling, similarity, family = "mean", "dot", "sparse"

    def encode_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None, chunk: int | None = None,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.last_layer_only(layers)
        for positions, codes in self.sparse_chunks(texts, max_length, batch_size, chunk):
            dense = codes.toarray()
            yield positions, np.broadcast_to(dense, (1, len(POOLINGS), *dense.shape))

    def sparse_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                      chunk: int | None = None) -> Iterator[tuple[np.ndarray, sparse.csr_matrix]]:
        """(positions in `texts`, their codes as a float32 (positions, dim) sparse matrix), `chunk` texts at a time."""
        self.model.max_seq_length = max_length
        chunk = chunk or max(1, len(texts))
        with StageProgress(len(texts), "texts") as progress:
            for start in range(0, len(texts), chunk):
                part = texts[start : start + chunk]
                codes = sparse.vstack([self._codes(part[i : i + batch_size]) for i in range(0, len(part), batch_size)],
                                      format="csr")
                progress.advance(len(part))
                yield np.arange(start, start + len(part)), codes

    def _codes(self, texts: list[str] | list[Tokens]) -> sparse.csr_matrix:
        """(texts, dim) codes of the texts (stored ids padded, or texts tokenized), the model's top max_active_dims."""
        with torch.inference_mode(), precision.autocast(self.model.device, self.dtype):
            codes = self.model(to_device(features(self.model, texts), self.model.device))["sentence_embedding"]
            if self.model.max_active_dims is not None:
                codes = select_max_active_dims(codes, max_active_dims=self.model.max_active_dims)
        return sparse.csr_matrix(codes.float().cpu().numpy())


class PooledEncoder(Encoder):
    """A model loaded once, then used for every text set an evaluation needs. With an `onnx` or
    `openvino` backend it runs exported on the CPU (`quantized`: its int8 variant), and gives the
    last layer only."""

    def __init__(self, model: str, device: str = "auto", pooling: str = "mean", dtype: str = "fp32",
                 backend: str = "torch", quantized: bool = False):
        families.dense_only(model, "a pooled encoder (its backbone's token states, pooled)")
        self.pooling, self.backend = pooling, backend
        self.tokenizer = load_tokenizer(model)
        self.config = load_model(model, AutoConfig.from_pretrained)
        if backend == "torch":
            self.model = load_model(model, lambda p: AutoModel.from_pretrained(p, dtype=torch.float32))
            decoders.loaded_attention(self.model)
            self.model = self.model.to(pick_device(device)).eval()
            self.dtype = precision.autocast_dtype(dtype, self.model.device)
            if self.model.device.type == "cuda":  # weights held in the dtype, not re-cast by autocast every batch
                self.model.to(self.dtype)
            self.host_mask = self.config.model_type in HOST_MASKED and self.model.config._attn_implementation == "sdpa"
        else:
            with tempfile.TemporaryDirectory() as export:  # the runtime has read the file once built
                file = load_model(model, lambda p: backends.backend_file(p, backend, Path(export), quantized))
                self.runtime = backends.Runtime(file, backend, precision.autocast_dtype(dtype, "cpu"))
            self.dtype = self.runtime.dtype

    @property
    def n_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    def encode_chunks(self, texts: list[str] | list[Tokens], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None, chunk: int | None = None,
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(positions in `texts`, their embeddings of shape (len(layers), len(POOLINGS), len(positions),
        dim)) for chunks of about `chunk` texts (default: all in one); layers default to the last. `texts` may
        be the ids the text_tokens stage stored for them (made with this max length): they are padded, not
        tokenized."""
        layers = [self.n_layers] if layers is None else layers
        # Longest first over all texts (stored ids: in tokens, else in characters), so texts of similar length share
        # a batch and little padding is computed. A chunk is whole batches: chunking changes no batch, hence no vector.
        order = np.argsort([-len(t.ids) if isinstance(t, Tokens) else -len(t) for t in texts], kind="stable")
        chunk = batch_size * max(1, -(-(chunk or len(texts)) // batch_size))

        def tokenized() -> Iterator[tuple[int, dict]]:  # on a background thread, ahead of the model
            for first in range(0, len(texts), batch_size):
                yield first, self._inputs([texts[i] for i in order[first : first + batch_size]], max_length)

        def pooled(batches: Iterator[tuple[int, dict]]) -> Iterator[tuple[int, np.ndarray]]:
            """(first, vectors) a batch behind: the next batch is started before a batch's vectors are read, so
            that on a GPU they come home while it runs."""
            waiting = None  # (first, its vectors' call) of the batch started last
            for first, inputs in itertools.chain(batches, [(None, None)]):  # the end reads the last batch
                started = None if inputs is None else (first, self._pooled(inputs, layers))
                if waiting:
                    yield waiting[0], waiting[1]()
                waiting = started

        with StageProgress(len(texts), "texts") as progress, \
                tqdm(total=-(-len(texts) // batch_size), desc=progress.label, unit="batch", mininterval=5,
                     disable=not progress.shown) as bar, \
                contextlib.closing(prefetched(tokenized())) as batches:
            for first, vectors in pooled(batches):
                start, end = first - first % chunk, min(first - first % chunk + chunk, len(texts))
                if first == start:
                    out = np.empty((len(layers), len(POOLINGS), end - start, self.dim), dtype=np.float32)
                size = vectors.shape[2]
                out[:, :, first - start : first - start + size] = vectors
                progress.advance(size)
                bar.update()
                if first + size == end:
                    yield order[start:end], out

    def _inputs(self, texts: list[str] | list[Tokens], max_length: int) -> dict:
        """One batch's tokens (stored ids padded, or texts tokenized): NumPy for an exported backend, on the model's
        device for torch."""
        torch_backend = self.backend == "torch"
        encoded = (padded_ids(self.tokenizer, texts) if isinstance(texts[0], Tokens)
                   else encoder_tokenize(self.tokenizer, texts, max_length))
        batch = token_arrays(encoded, as_numpy=not torch_backend)
        if not torch_backend:
            return batch
        if self.host_mask:  # where a token is padding SDPA's mask, else none (the model's own rule), without a sync
            mask = batch["attention_mask"]
            batch[MODEL_MASK] = None if mask.all() else mask[:, None, None, :].bool()  # [texts, 1, 1, tokens]
        return to_device(batch, self.model.device)

    def _pooled(self, batch: dict, layers: list[int]) -> Callable[[], np.ndarray]:
        """One batch, started: a call that gives its vectors, (len(layers), len(POOLINGS), len(texts), dim). On a
        GPU nothing waits for the device (the mask comes ready: HOST_MASKED) and the vectors are copied to pinned
        memory without waiting, so the caller can start the next batch before the call waits for them."""
        if self.backend != "torch":
            if layers != [self.n_layers]:
                raise ValueError(f"the {self.backend} backend gives the last layer only, not layers {layers}")
            hidden = torch.from_numpy(self.runtime(batch))  # (texts, tokens, dim)
            mask = torch.from_numpy(batch["attention_mask"])
            return torch.stack([pool(hidden, mask, pooling) for pooling in POOLINGS])[None].numpy
        inputs = dict(batch)  # the model's mask in place of the 2-D one, which pooling reads
        if MODEL_MASK in inputs:
            inputs["attention_mask"] = inputs.pop(MODEL_MASK)
        with torch.inference_mode(), precision.autocast(self.model.device, self.dtype):
            hidden = self.model(**inputs, output_hidden_states=len(layers) > 1 or layers[0] != self.n_layers)
            states = (hidden.hidden_states if hidden.hidden_states is not None
                      else {self.n_layers: hidden.last_hidden_state})
            vectors = torch.stack([torch.stack([pool(states[layer].float(), batch["attention_mask"], pooling)
                                                for pooling in POOLINGS]) for layer in layers])
        if vectors.device.type != "cuda":
            return vectors.cpu().numpy
        home = torch.empty(vectors.shape, dtype=vectors.dtype, pin_memory=True)  # torch caches pinned blocks
        home.copy_(vectors, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def arrived() -> np.ndarray:
            copied.synchronize()
            return home.numpy()
        return arrived
