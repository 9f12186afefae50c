"""Evaluation encoding: raw (not normalised) pooled embeddings, as the papers measure them.

Loads any model folder or Hub name through `AutoModel.from_pretrained` and pools token states
itself, so the model's own head (e.g. a Normalize module) does not change the metric. Pooling is
mean (the papers' default) or the token a recipe trained: CLS (first) or SEP (last unpadded).
`encode_layers` gives every hidden layer and every pooling from one forward pass, which is what
the embeddings cache stores (layer 0 = the embedding layer).
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from tasks.models import load_model, pick_device
from tasks.progress import StageProgress

POOLINGS = ("mean", "cls", "sep")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "sep":
        return hidden[torch.arange(len(hidden)), attention_mask.sum(1) - 1]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


class PooledEncoder:
    """A model loaded once, then used for every text set an evaluation needs."""

    def __init__(self, model: str, device: str = "auto", pooling: str = "mean"):
        self.pooling = pooling
        self.tokenizer = load_model(model, AutoTokenizer.from_pretrained)
        self.model = load_model(model, AutoModel.from_pretrained).to(pick_device(device)).eval()

    @property
    def n_layers(self) -> int:
        return self.model.config.num_hidden_layers

    def encode_layers(self, texts: list[str], max_length: int = 256, batch_size: int = 32,
                      layers: list[int] | None = None) -> np.ndarray:
        """Embeddings of shape (len(layers), len(POOLINGS), len(texts), hidden); layers default to the last."""
        layers = [self.n_layers] if layers is None else layers
        # Longest first, so texts of similar length share a batch and little padding is computed.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(layers), len(POOLINGS), len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode(), StageProgress(len(texts), "texts") as progress:
            for start in tqdm(range(0, len(texts), batch_size), desc=progress.label, unit="batch", mininterval=5):
                idx = order[start : start + batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=max_length, return_tensors="pt").to(self.model.device)
                hidden = self.model(**batch, output_hidden_states=len(layers) > 1 or layers[0] != self.n_layers)
                states = (hidden.hidden_states if hidden.hidden_states is not None
                          else {self.n_layers: hidden.last_hidden_state})
                for i, layer in enumerate(layers):
                    for j, pooling in enumerate(POOLINGS):
                        out[i, j, idx] = pool(states[layer], batch["attention_mask"], pooling).float().cpu().numpy()
                progress.advance(len(idx))
        return out

    def encode(self, texts: list[str], max_length: int = 256, batch_size: int = 32) -> np.ndarray:
        """Last layer, this encoder's pooling."""
        return self.encode_layers(texts, max_length, batch_size)[0, POOLINGS.index(self.pooling)]
