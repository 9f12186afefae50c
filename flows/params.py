"""The flows' parameters as pydantic models: the Prefect UI renders them as a form with these
defaults and descriptions, and rejects a value that breaks a constraint before the run is created.

A config that does not exist, or an override that breaks the config's own validation, fails the
flow run before its first task, with a message naming the file and field (shown in the UI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.core.identity import LIBRARIES


class RunParams(BaseModel):
    """Which experiment config to run, with optional field overrides, and where the artifacts go."""

    model_config = ConfigDict(extra="forbid")

    config: str = Field("configs/demo.yaml", pattern=r"\.ya?ml$",
                        description="Experiment YAML (see configs/): absolute, or relative to the folder "
                        "the server was started in.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description='Config fields to change for this run, by dotted name, e.g. '
                                      '{"train.epochs": 2, "data.limit": 500}. Checked like the YAML.')
    store: str | None = Field(None, description="Artifact store folder. Empty: EMBFORGE_STORE, else the "
                              "config's `store`.")
    rebuild_stale_versions: bool = Field(False, description="Rebuild cached artifacts that were built with "
                                         f"other versions of {', '.join(LIBRARIES)} than the ones installed, and "
                                         "what reads them (by default they are reused and reported).")

    @field_validator("config")
    @classmethod
    def _config_exists(cls, path: str) -> str:
        if not Path(path).is_file():
            raise ValueError(f"config file not found: {path} (relative paths start in {Path.cwd().name}/)")
        return path

    def changes(self) -> dict[str, Any]:
        """The config fields this run changes: `overrides`, and a flow's own parameters for them."""
        return self.overrides


class TrainParams(RunParams):
    methods: list[str] = Field(default_factory=list, description="Train only these methods of the config "
                               "(by name; a sweep's name: all its values). Empty: all of them.")


class EvaluateParams(RunParams):
    """Score registered models on the config's benchmark set (its `data` and `evaluate` sections)."""

    models: list[str] = Field(default_factory=list, description="Registered models to evaluate, by label or "
                              "artifact (train/<key>); see `embforge models`. Empty: every registered model.")
    force: bool = Field(False, description="Score again even what is already scored with the same model, "
                        "task, task revision and settings.")


# The select command's defaults, relative to the repository (the UI's form runs from it; the CLI from anywhere).
SELECT_CONFIG = "configs/select.yaml"


class SelectParams(RunParams):
    """Pick the recipe for a corpus, scored on held-out documents (by your queries, else their labels, else their
    titles, else an LLM's queries), train the winner and export it (docs/select.md)."""

    config: str = Field(SELECT_CONFIG, pattern=r"\.ya?ml$", description="Config with the defaults (the "
                        f"model, the candidates, the yardstick): {SELECT_CONFIG}, or a copy of it.")
    corpus: str | None = Field(None, description="The corpus file or folder (Parquet, CSV or JSONL with a text "
                               "column, or .txt/.md files; labels or titles are used where it has them). Empty: the "
                               "config's `data.path`.")
    qrels: str | None = Field(None, description="Your queries and their relevant documents (Parquet: query_id, "
                              "query, doc_id, score): they decide (`evaluate.yardstick.kind: qrels`). Empty: the "
                              "config's yardstick.")
    budget: int | None = Field(None, ge=2, description="Training steps of the winner. Empty: the config's "
                               "`select.budget`.")
    recipes: list[str] = Field(default_factory=list, description="Candidate recipes. Empty: the config's "
                               "`select.recipes`.")
    families: list[str] = Field(default_factory=list, description="Model families each recipe is tried as (dense, "
                                "multi_vector, sparse; docs/families.md). Empty: the config's `select.families`.")
    out: str | None = Field(None, description="Folder to export the chosen model to (new or empty). Empty: the "
                            "config's `select.out`, else selected/<the corpus's name>.")
    static: bool = Field(False, description="Also distil the chosen model into a static embedding model (CPU speed), "
                         "scored and exported beside it to <out>-static (`select.static`).")

    def changes(self) -> dict[str, Any]:
        own = {"data.path": str(Path(self.corpus).resolve()) if self.corpus else None,
               "evaluate.yardstick.qrels": str(Path(self.qrels).resolve()) if self.qrels else None,
               "evaluate.yardstick.kind": "qrels" if self.qrels else None,  # they decide, or say why they cannot
               "select.budget": self.budget,
               "select.recipes": self.recipes or None, "select.families": self.families or None,
               "select.out": self.out,
               "select.static": True if self.static else None}
        return {**self.overrides, **{k: v for k, v in own.items() if v is not None}}
