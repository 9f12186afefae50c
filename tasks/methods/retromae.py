"""RetroMAE: a masked auto-encoder whose decoder must rebuild the text from the sentence embedding.

Encoder: the model itself as a BERT MLM on whole-word-masked input (30%); its last-layer [CLS] is
the sentence embedding h. Decoder: one fresh transformer layer with "enhanced decoding": every
position queries with h + p_i over keys/values [h; e(x_1)+p_1, ...] of the ORIGINAL tokens, each row
seeing h and a random half of the other tokens but never itself. A one-layer decoder with little
context can only reconstruct the text if h carries it, which is what trains h. Embeddings and MLM
head are shared with the encoder; decoder and head live in the loss module and are never saved.
Optional "+ InfoNCE": two texts per example (two sentences of one document), InfoNCE on their h.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from torch import nn

from tasks.encoders.inputs import Tokens, padded_tokens, word_tokenize
from tasks.encoders.models import to_device
from tasks.methods.distributed import Gather, no_gather
from tasks.methods.infonce import info_nce
from tasks.methods.masking import mask_tokens
from tasks.methods.mlm import encoder_inputs, maskable_positions, masked_lm_head, selected_ce


def decoder_attention_mask(attention_mask: torch.Tensor, visible: float) -> torch.Tensor:
    """[B, L, L] bool, True = row i may attend to column j: column 0 (h) always, each other real
    token with probability `visible`, never itself (it would just copy its own answer), never padding.
    Row 0 sees column 0 only."""
    B, L = attention_mask.shape
    allowed = torch.rand(B, L, L, device=attention_mask.device) < visible
    allowed &= attention_mask.bool()[:, None, :]
    allowed &= ~torch.eye(L, dtype=torch.bool, device=attention_mask.device)
    allowed[:, 0] = False  # row 0 is h's own slot ([CLS], no label): nothing to reconstruct
    allowed[:, :, 0] = True  # also keeps padded rows' softmax from being over nothing (NaN)
    return allowed


def retromae_features(model: SentenceTransformer, column: list[str] | list[Tokens]) -> dict:
    """A batch's column (texts, or the tokens stage's ids with their words) as padded inputs plus `word_ids`
    (NO_WORD on special and padding tokens) for whole-word masking."""
    return padded_tokens(model, column, words=True) if isinstance(column[0], Tokens) else word_tokenize(model, column)


class EnhancedDecoder(nn.Module):
    """One post-LN BERT layer whose queries and keys/values come from different streams."""

    def __init__(self, config):
        super().__init__()
        H, self.heads = config.hidden_size, config.num_attention_heads
        self.query, self.key_value, self.out = nn.Linear(H, H), nn.Linear(H, 2 * H), nn.Linear(H, H)
        self.ln_attn = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.ff = nn.Sequential(nn.Linear(H, config.intermediate_size), nn.GELU(),
                                nn.Linear(config.intermediate_size, H))
        self.ln_ff = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attn_dropout = config.attention_probs_dropout_prob
        for m in self.modules():  # BERT's init, as RetroMAE's decoder (a copy of a BERT layer) gets
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=config.initializer_range)
                nn.init.zeros_(m.bias)

    def forward(self, query: torch.Tensor, key_value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """query, key_value: (B, L, H); mask: (B, L, L) bool. Returns (B, L, H)."""
        B, L, H = query.shape
        q = self.query(query).view(B, L, self.heads, -1).transpose(1, 2)  # (B, heads, L, H/heads)
        # (B, L, 2H) -> (B, L, 2, heads, H/heads) -> (2, B, heads, L, H/heads): k and v
        k, v = self.key_value(key_value).view(B, L, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None],  # mask (B, 1, L, L): every head
                                           dropout_p=self.attn_dropout if self.training else 0.0)
        a = a.transpose(1, 2).reshape(B, L, H)  # (B, heads, L, H/heads) -> (B, L, H)
        # Residual on the query stream: the output at i is a prediction for position i.
        x = self.ln_attn(query + self.dropout(self.out(a)))
        return self.ln_ff(x + self.dropout(self.ff(x)))


class RetroMAELoss(nn.Module):
    def __init__(self, model: SentenceTransformer, mask_ratio: float, decoder_visible: float,
                 temperature: float | None = None, gather: Gather = no_gather):
        super().__init__()
        self.gather = gather  # the InfoNCE term's rows, from every process
        self.model = model  # a submodule, so the optimiser over this loss's parameters trains it
        self.head = masked_lm_head(model)
        self.decoder = EnhancedDecoder(model.transformers_model.config).to(model.device)
        self.mask_ratio, self.decoder_visible, self.temperature = mask_ratio, decoder_visible, temperature

    def reconstruct(self, features: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(encoder MLM loss, decoder loss, h) for one batch of `retromae_features`."""
        encoder, tokenizer = self.model.transformers_model, self.model.tokenizer
        f = to_device(features, self.model.device)
        ids, attention = f["input_ids"], f["attention_mask"]
        maskable = maskable_positions(self.model, ids, attention)
        masked, enc_labels = mask_tokens(ids, maskable, self.mask_ratio, tokenizer.mask_token_id,
                                         len(tokenizer), f["word_ids"])
        hidden = encoder(input_ids=masked, **encoder_inputs(f)).last_hidden_state  # (B, L, H)
        h = hidden[:, 0]  # (B, H): [CLS], the sentence embedding

        embeddings = encoder.embeddings
        key_value = embeddings(input_ids=ids, token_type_ids=f.get("token_type_ids"))  # (B, L, H), unmasked
        key_value = torch.cat([h[:, None], key_value[:, 1:]], dim=1)  # slot 0 holds h instead of [CLS]
        positions = embeddings.position_embeddings(torch.arange(ids.shape[1], device=ids.device))  # (L, H)
        query = h[:, None] + positions[None]  # (B, 1, H) + (1, L, H) -> (B, L, H): h + p_i
        decoded = self.decoder(query, key_value, decoder_attention_mask(attention, self.decoder_visible))
        dec_labels = ids.masked_fill(~maskable, -100)
        return selected_ce(self.head, hidden, enc_labels), selected_ce(self.head, decoded, dec_labels), h

    def losses(self, sentence_features: list[dict]) -> dict[str, torch.Tensor]:
        """The loss terms; with (anchor, positive) the RetroMAE terms are averaged over the two, so
        they weigh what they weigh in plain RetroMAE next to the added InfoNCE term."""
        parts = [self.reconstruct(f) for f in sentence_features]
        terms = {"encoder": sum(p[0] for p in parts) / len(parts), "decoder": sum(p[1] for p in parts) / len(parts)}
        if self.temperature is not None:
            if len(parts) != 2:
                raise ValueError(f"RetroMAE + InfoNCE needs (anchors, positives), got {len(parts)} inputs")
            terms["infonce"] = info_nce(self.gather(parts[0][2]), self.gather(parts[1][2]), self.temperature)
        return terms

    def forward(self, sentence_features: list[dict], labels=None) -> torch.Tensor:
        return sum(self.losses(sentence_features).values())
