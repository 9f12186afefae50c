"""BERT-style input corruption for masked-language-model objectives (MLM and RetroMAE's encoder).

All randomness comes from torch's global RNG (no generator argument): the training loop seeds it and
checkpoints its state, which is what makes a resumed run bit-exact.
"""

import torch


def mask_tokens(input_ids: torch.Tensor, maskable: torch.Tensor, ratio: float, mask_token_id: int,
                vocab_size: int, word_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Select `ratio` of the maskable tokens (or of the words, when `word_ids` is given: all of a
    selected word's tokens go together) and corrupt them 80% [MASK] / 10% random id / 10% unchanged.

    Returns (masked_ids, labels): labels hold the original id at selected positions, -100 elsewhere.
    Every row with a maskable token gets at least one selected token (a whole word in word mode):
    a row with none would make the mean cross-entropy over its selected tokens 0/0 = NaN when it is
    alone in a batch. This nudges the effective ratio up for very short texts only.
    """
    B, L = input_ids.shape
    device = input_ids.device
    if word_ids is None:
        selected = torch.rand(B, L, device=device) < ratio
    else:
        # One draw per word, broadcast to its tokens; -1 (special/pad) is clamped and then dropped.
        chosen = torch.rand(B, int(word_ids.max().clamp(min=0)) + 1, device=device) < ratio
        selected = chosen.gather(1, word_ids.clamp(min=0)) & (word_ids >= 0)
    selected &= maskable

    # Fallback for empty rows: one random maskable token (its whole word in word mode). Drawn for
    # every row so that the RNG stream does not depend on the outcome above.
    pick = torch.rand(B, L, device=device).masked_fill(~maskable, -1).argmax(1, keepdim=True)
    if word_ids is None:
        forced = torch.zeros_like(maskable).scatter_(1, pick, True)
    else:
        forced = word_ids == word_ids.gather(1, pick)
    empty = ~selected.any(1, keepdim=True)
    selected |= forced & maskable & empty

    labels = input_ids.masked_fill(~selected, -100)
    action = torch.rand(B, L, device=device)
    random_ids = torch.randint(vocab_size, (B, L), device=device, dtype=input_ids.dtype)
    masked = input_ids.masked_fill(selected & (action < 0.8), mask_token_id)
    masked = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, labels
