"""Cached in-batch losses (GradCache, Gao et al. 2021): a batch of any size in the memory of a mini-batch.

1. Embed the batch `mini_batch_size` rows at a time without gradients, noting each mini-batch's RNG state.
2. The loss over all the embeddings, and its gradient with respect to them (cheap: no encoder in it).
3. In the loss's backward pass, embed each mini-batch again with gradients, replaying its RNG state
   so that dropout draws the same masks, and backpropagate the cached gradient through it.

The parameters' gradients are those of the full batch; activations are held for one mini-batch at a
time. It wraps any loss with `embed(features) -> embeddings` and `score(embeddings) -> loss`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from sentence_transformers.multi_vector_encoder.losses import CachedMultiVectorMultipleNegativesRankingLoss
from sentence_transformers.sparse_encoder import losses as sparse_losses
from torch import nn


class RandomState:
    """The generators' state at one moment, to draw the same numbers again (dropout masks)."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if self.cuda else []):
            torch.set_rng_state(self.cpu)
            if self.cuda:
                torch.cuda.set_rng_state_all(self.cuda)
            yield


def mini_batches(features: dict, size: int) -> Iterator[dict]:
    """Rows [i, i + size) of every tensor of a tokenised batch (padded to the batch's length once)."""
    rows = len(features["input_ids"])
    for start in range(0, rows, size):
        yield {k: v[start:start + size] if torch.is_tensor(v) else v for k, v in features.items()}


def autocast_state(module: nn.Module) -> dict:
    """torch.autocast's arguments as they are now on `module`'s device: the backward pass re-embeds under them, as
    the forward pass embedded (embforge's loop autocasts the forward pass only, not the backward)."""
    device = next(module.parameters()).device.type
    return dict(device_type=device, dtype=torch.get_autocast_dtype(device), enabled=torch.is_autocast_enabled(device))


class ReplayedAutocast:
    """A sentence-transformers cached loss (its GradCache mixin) whose backward pass re-embeds under the forward
    pass's autocast: the library leaves that to the Trainer's accelerate, which autocasts the model's forward wherever
    it runs."""

    def forward(self, sentence_features: list[dict], labels=None):
        self.autocast = autocast_state(self)
        return super().forward(sentence_features, labels)

    def embed_minibatch(self, *args, **kwargs):
        with torch.autocast(**self.autocast):
            return super().embed_minibatch(*args, **kwargs)


class CachedMaxSimLoss(ReplayedAutocast, CachedMultiVectorMultipleNegativesRankingLoss):
    """sentence-transformers' cached MaxSim InfoNCE: the multi-vector family's GradCache."""


class CachedSpladeLoss(ReplayedAutocast, sparse_losses.CachedSpladeLoss):
    """sentence-transformers' cached SPLADE loss (InfoNCE and the FLOPS regularisers): SPLADE's GradCache."""


class CachedLoss(nn.Module):
    """`loss` computed in mini-batches of `mini_batch_size` rows, with the full batch's gradients."""

    def __init__(self, loss: nn.Module, mini_batch_size: int):
        super().__init__()
        self.loss = loss
        self.mini_batch_size = mini_batch_size

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        autocast = autocast_state(self)
        states, embeddings = [], []
        for features in sentence_features:
            parts = []
            for batch in mini_batches(features, self.mini_batch_size):
                states.append(RandomState())
                with torch.no_grad():
                    parts.append(self.loss.embed([batch])[0])  # (rows of the mini-batch, D)
            embeddings.append(torch.cat(parts).detach().requires_grad_())  # (rows, D)
        with torch.enable_grad():
            loss = self.loss.score(embeddings)
            loss.backward()  # fills embeddings[i].grad; the encoder is not in this graph
        cached = [e.grad for e in embeddings]
        loss = loss.detach().requires_grad_()
        loss.register_hook(lambda grad: self._backward(sentence_features, states, cached, autocast, grad))
        return loss

    def _backward(self, sentence_features: list[dict], states: list[RandomState], cached: list[torch.Tensor],
                  autocast: dict, grad: torch.Tensor) -> None:
        """Re-embed each mini-batch with gradients and push the cached gradient (times the loss's own,
        e.g. fp16's loss scale) into the encoder."""
        state = iter(states)
        with torch.enable_grad(), torch.autocast(**autocast):
            for features, gradient in zip(sentence_features, cached):
                for batch, part in zip(mini_batches(features, self.mini_batch_size),
                                       gradient.split(self.mini_batch_size)):
                    with next(state).replayed():
                        embedded = self.loss.embed([batch])[0]  # (rows of the mini-batch, D)
                    embedded.backward(part * grad)
