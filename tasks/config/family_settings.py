"""The settings of each model family other than dense (tasks/config/families.py): a method's `multi_vector` and
`sparse` sections (docs/families.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.config.base import Section


class MultiVectorSettings(Section):
    """The multi_vector family's head and loss (ColBERT's and PyLate's defaults)."""

    dim: int = Field(128, ge=8, description="Width of each token's vector: a linear projection (no bias) of the "
                     "token states, trained from a random start (ColBERT: 128).")
    scale: float = Field(1.0, gt=0, description="The InfoNCE's 1 / temperature on MaxSim scores (a sum over the "
                         "query's tokens, not a cosine: PyLate's 1.0).")
    skip_punctuation: bool = Field(True, description="Leave documents' punctuation tokens out of MaxSim, as ColBERT "
                                   "and PyLate do.")
    query_expansion: int | None = Field(None, ge=1, description="Widen every query to at least this many tokens "
                                        "with the mask token ([MASK]), whose vectors MaxSim scores too: ColBERT's "
                                        "query augmentation (32 there and in PyLate), in training and in every query "
                                        "the saved model encodes (sentence-transformers' `min` strategy: a longer "
                                        "query is kept whole). None: off, as sentence-transformers' fresh models are.")


# CSR's loss also rebuilds the vector from the top 4k codes (sentence-transformers' SparseAutoEncoder): a sparse
# model's width must hold that many.
RECONSTRUCTED_TOP = 4


class SparseSettings(Section):
    """The sparse family's head and loss: CSR's sparse autoencoder on the dense vector (its paper's and
    sentence-transformers' defaults)."""

    active_dims: int = Field(256, ge=1, description="The codes each text keeps: the autoencoder's top k latents "
                             "(the rest are zero), so at most this many are active in any document or query.")
    width: int | None = Field(None, ge=2, description="The autoencoder's number of codes (its hidden width); None: 4 "
                              "times the base's vector width (CSR's).")
    aux_dims: int = Field(512, ge=0, description="CSR's auxiliary top k over codes not active for a while (dead "
                          "latents), whose reconstruction of the residual revives them; 0: none.")
    aux_weight: float = Field(0.1, ge=0, description="Weight of that auxiliary reconstruction (CSR's beta).")
    scale: float = Field(20.0, gt=0, description="The InfoNCE's 1 / temperature on the codes' dot products. The "
                         "codes are of the unit vector, so their dot products lie within about [0, 1.4], as narrow as "
                         "cosines: the dense default's 20, not the 1.0 sentence-transformers gives SPLADE's unbounded "
                         "term weights (at 1.0 the loss stays near ln(batch) and hardly trains).")

    def resolved_width(self, dim: int) -> int:
        return self.width or 4 * dim

    @property
    def min_width(self) -> int:
        """The fewest codes that hold CSR's top RECONSTRUCTED_TOP x active_dims."""
        return RECONSTRUCTED_TOP * self.active_dims

    @model_validator(mode="after")
    def _fits(self) -> SparseSettings:
        top = RECONSTRUCTED_TOP
        if self.width is not None and self.min_width > self.width:  # a base's own width is known at training
            raise ValueError(f"active_dims ({self.active_dims}) must be at most width / {top} ({self.width // top}): "
                             f"CSR's loss also rebuilds the vector from the top {top} x active_dims codes")
        return self


FamilySettings = MultiVectorSettings | SparseSettings
