"""Evaluation encoding: raw (not normalised) pooled embeddings, as the papers measure them.

Loads any model folder or Hub name through `AutoModel.from_pretrained` and pools the last layer
itself, so the model's own head (e.g. a Normalize module) does not change the metric. Pooling is
mean (the papers' default) or the token a recipe trained: CLS (first) or SEP (last unpadded).
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from tasks.models import pick_device, resolve_model


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
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(pick_device(device)).eval()

    def encode(self, texts: list[str], max_length: int = 256, batch_size: int = 32) -> np.ndarray:
        # Longest first, so texts of similar length share a batch and little padding is computed.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for start in tqdm(range(0, len(texts), batch_size), desc="encode", unit="batch", mininterval=5):
                idx = order[start : start + batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=max_length, return_tensors="pt").to(self.model.device)
                hidden = self.model(**batch).last_hidden_state
                out[idx] = pool(hidden, batch["attention_mask"], self.pooling).float().cpu().numpy()
        return out
