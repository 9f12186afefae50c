"""The settings of each model family other than dense (tasks/config/families.py): a method's `multi_vector` and
`sparse` sections (docs/families.md)."""

from __future__ import annotations

from typing import Literal

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

# Each kind's own settings: the other kind's, set to other than their defaults, are one error naming them.
KIND_FIELDS = {"csr": ("width", "aux_dims", "aux_weight"),
               "splade": ("document_regularizer", "query_regularizer", "regularizer_warmup")}
# The InfoNCE's 1 / temperature by kind (SparseSettings.scale says why)
KIND_SCALES = {"csr": 20.0, "splade": 1.0}


class SparseSettings(Section):
    """The sparse family's head and loss: CSR's sparse autoencoder on the dense vector, or SPLADE's term weights from
    a masked-LM head (their papers' and sentence-transformers' defaults)."""

    kind: Literal["csr", "splade"] = Field("csr", description="`csr`: a sparse autoencoder on the dense vector "
                                           "(any base). `splade`: the base's masked-LM head gives each token a "
                                           "weight for every vocabulary term (log(1 + ReLU), the maximum over the "
                                           "text's tokens), kept few by the FLOPS regulariser: the base must be a "
                                           "masked-LM encoder (BERT, DistilBERT, ...), and where its checkpoint has "
                                           "no trained head (all-MiniLM-L6-v2) the head starts random.")
    active_dims: int = Field(256, ge=1, description="The codes each text keeps. CSR: the autoencoder's top k latents "
                             "(the rest are zero). SPLADE: its top k term weights when a text is encoded (sentence-"
                             "transformers' max_active_dims; training reads them all). Either way at most this many "
                             "are active in any document or query.")
    width: int | None = Field(None, ge=2, description="CSR: the autoencoder's number of codes (its hidden width); "
                              "None: 4 times the base's vector width (CSR's). SPLADE's width is the vocabulary.")
    aux_dims: int = Field(512, ge=0, description="CSR: its auxiliary top k over codes not active for a while (dead "
                          "latents), whose reconstruction of the residual revives them; 0: none.")
    aux_weight: float = Field(0.1, ge=0, description="CSR: the weight of that auxiliary reconstruction (its beta).")
    document_regularizer: float = Field(3e-5, ge=0, description="SPLADE: the weight of the FLOPS regulariser on the "
                                        "documents' term weights (the positives and hard negatives), which keeps few "
                                        "terms active (sentence-transformers' example: 3e-5).")
    query_regularizer: float = Field(5e-5, ge=0, description="SPLADE: the FLOPS regulariser's weight on the queries' "
                                     "(the anchors') term weights (sentence-transformers' example: 5e-5).")
    regularizer_warmup: float = Field(1 / 3, ge=0, le=1, description="SPLADE: the share of the training steps over "
                                      "which both regularisers' weights rise from 0 to theirs, quadratically (what "
                                      "sentence-transformers' trainer does by default, with its "
                                      "SpladeRegularizerWeightSchedulerCallback: the term weights first learn to "
                                      "rank, then to be few). 0: the full weights from the first step.")
    scale: float | None = Field(None, gt=0, description="The InfoNCE's 1 / temperature on the codes' dot products. "
                                "None: the kind's, 20 for CSR (its codes are of the unit vector, so their dot products "
                                "are as narrow as cosines: at 1.0 the loss stays near ln(batch) and hardly trains) and "
                                "1.0 for SPLADE's unbounded term weights (sentence-transformers').")

    def resolved_width(self, dim: int) -> int:
        return self.width or 4 * dim

    @property
    def resolved_scale(self) -> float:
        return self.scale or KIND_SCALES[self.kind]

    @property
    def min_width(self) -> int:
        """The fewest codes that hold CSR's top RECONSTRUCTED_TOP x active_dims."""
        return RECONSTRUCTED_TOP * self.active_dims

    @model_validator(mode="after")
    def _fits(self) -> SparseSettings:
        # set to other than their defaults (a dump of the settings, read back, names every field)
        others = [f for kind, fields in KIND_FIELDS.items() if kind != self.kind for f in fields
                  if getattr(self, f) != type(self).model_fields[f].default]
        if others:
            raise ValueError(f"{', '.join(others)}: not settings of kind {self.kind!r} (they are "
                             f"{'SPLADE' if self.kind == 'csr' else 'CSR'}'s)")
        top = RECONSTRUCTED_TOP
        if self.kind == "csr" and self.width is not None and self.min_width > self.width:  # a base's width is known
            raise ValueError(f"active_dims ({self.active_dims}) must be at most width / {top} ({self.width // top}): "
                             f"CSR's loss also rebuilds the vector from the top {top} x active_dims codes")
        return self


FamilySettings = MultiVectorSettings | SparseSettings
