"""One experiment file: `PipelineConfig` composes the sections and checks the rules between them."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from storage.base import DEFAULT_STORE
from tasks.config.base import BASE, Section
from tasks.config.data import DataConfig, SentenceConfig
from tasks.config.evaluation import EvaluateConfig
from tasks.config.families import FAMILIES
from tasks.config.family_settings import FamilySettings
from tasks.config.model import ModelConfig
from tasks.config.queries import NegativesConfig, QueriesConfig
from tasks.config.recipes import RECIPES, recipes_of
from tasks.config.run import RetryConfig, RunConfig, TrackingConfig
from tasks.config.select import SelectConfig, rung_steps
from tasks.config.static import StaticConfig
from tasks.config.summaries import SummaryConfig
from tasks.config.training import (
    MethodConfig,
    TrainConfig,
    expand_chains,
    expand_sweeps,
    family_conflicts,
    merged_train,
)
from tasks.config.yardsticks import ranks_per_token


class PipelineConfig(Section):
    name: str = Field(description="Experiment name shown in runs and reports.")
    store: str = Field(DEFAULT_STORE, description="Artifact store folder (relative to the config "
                       "file's folder) or URL (s3://bucket/prefix); `--store` or EMBFORGE_STORE override it.")
    data: DataConfig
    sentences: SentenceConfig = Field(default_factory=SentenceConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    methods: list[MethodConfig] = Field(default_factory=list, description="Training recipes to compare; a "
                                        "method's `sweep: {field: [values]}` expands into one method per value, and "
                                        "a chained recipe (llm2vec) into one method per stage.")
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    summaries: SummaryConfig | None = Field(None, description="LLM summaries of the documents (SemCSE's "
                                            "positives); `summaries: {}` takes every default.")
    queries: QueriesConfig | None = Field(None, description="LLM-written queries per document and hard "
                                          "negatives mined for them (GPL's and InPars' training data); "
                                          "`queries: {}` takes every default.")
    negatives: NegativesConfig = Field(default_factory=NegativesConfig, description="How the hard negatives "
                                       "of the generated queries are mined (with `queries`).")
    retries: RetryConfig = Field(default_factory=RetryConfig, description="Task-level retries with back-off.")
    run: RunConfig = Field(default_factory=RunConfig, description="How the run uses this machine.")
    tracking: TrackingConfig | None = Field(None, description="Log every run to an experiment tracker too.")
    static: StaticConfig | None = Field(None, description="Static embedding models distilled from the run's "
                                        "models (model2vec, tokenlearn): `static: {of: [crops]}` (docs/static.md).")
    select: SelectConfig | None = Field(None, description="What `embforge select` searches: candidate recipes, "
                                        "learning rates, the step budget (docs/select.md); `embforge run` ignores it.")

    @field_validator("methods", mode="before")
    @classmethod
    def _sweeps(cls, methods):
        return expand_chains(expand_sweeps(methods)) if isinstance(methods, list) else methods

    @model_validator(mode="after")
    def _valid_methods(self) -> PipelineConfig:
        names = [m.name for m in self.methods]
        if len(names) != len(set(names)):
            raise ValueError(f"method names must be unique, got {names}")
        for i, method in enumerate(self.methods):
            if self.train_for(method, where=f"methods.{i}.train").eval_every and not self.evaluate.knn:
                raise ValueError(f"methods.{i}.train.eval_every: the learning curve is kNN accuracy, "
                                 "set `evaluate.knn`")
            if RECIPES[method.recipe].needs_summaries and self.summaries is None:
                raise ValueError(f"methods.{i}: recipe {method.recipe} trains on LLM summaries, add a "
                                 "`summaries` section (`summaries: {}` for the defaults)")
            if RECIPES[method.recipe].needs_queries and self.queries is None:
                raise ValueError(f"methods.{i}: recipe {method.recipe} trains on LLM-written queries, add a "
                                 "`queries` section (`queries: {}` for the defaults)")
            if RECIPES[method.recipe].margins and not self.negatives.cross_encoder:
                raise ValueError(f"methods.{i}: recipe {method.recipe} learns a cross-encoder's margins, set "
                                 "`negatives.cross_encoder` (GPL's: cross-encoder/ms-marco-MiniLM-L-6-v2)")
            if method.start_from is not None and method.start_from not in names[:i]:
                raise ValueError(f"methods.{i}.start_from: {method.start_from!r} is not a method before it; "
                                 f"those are {names[:i]}")
            if method.family != "dense":
                self._valid_family(i, method, names)
            if method.knn_holdout and not self.evaluate.knn:
                raise ValueError(f"methods.{i}.knn_holdout: holds out kNN's test split, set `evaluate.knn`")
        if self.model.pretrain and self.model.pretrain.method.family != "dense":
            raise ValueError("model.pretrain.method.family: stage 1 trains the dense model every method starts from")
        unknown = sorted(set(self.static.of) - {BASE, *names}) if self.static else []
        if unknown:
            raise ValueError(f"static.of: {unknown} are not methods of this config; it has {[BASE, *names]}")
        if self.select:
            self._valid_select()
        if self.model.pretrain:
            self.model.pretrain.train_for()
            if self.model.pretrain.method.start_from:
                raise ValueError("model.pretrain.method.start_from: stage 1 starts from the base model")
            recipe = RECIPES[self.model.pretrain.method.recipe]
            if recipe.needs:
                raise ValueError("model.pretrain.method: stage 1 runs on a generic corpus without summaries or "
                                 f"queries, {recipe.name} cannot be its recipe")
        return self

    def _valid_family(self, i: int, method: MethodConfig, names: list[str]) -> None:
        """A method of a family other than dense: its train settings, and no model of another family before or
        after it (the family's head is trained from its own start)."""
        self._family_trained_and_scored(f"methods.{i}", method.family, method.family_settings,
                                        self.train_for(method, where=f"methods.{i}.train"),
                                        "; leave them unset for this method")
        splade = method.family == "sparse" and method.sparse.kind == "splade"
        if method.start_from is not None and not splade:  # SPLADE may take an mlm method's encoder and its head
            raise ValueError(f"methods.{i}.start_from: a {method.family} model starts from the base model, not "
                             "from another method's model (a SPLADE one may: `sparse.kind: splade`)")
        if self.static and method.name in self.static.of:
            raise ValueError(f"static.of: {method.name!r} is a {method.family} model; a static model is distilled "
                             "from a dense one")
        if later := [m.name for m in self.methods if m.start_from == method.name]:
            raise ValueError(f"methods {later} start from {method.name!r}, a {method.family} model; start them from "
                             "a dense one")

    def _family_trained_and_scored(self, where: str, family: str, settings: FamilySettings, train: TrainConfig,
                                   advice: str = "") -> None:
        """A family other than dense (a method's, or among select's, with its `settings`) trains with `train` and is
        scored on torch at its last layer."""
        if conflicts := family_conflicts(family, train, settings):
            raise ValueError(f"{where}: the {family} family does not train with train.{'; train.'.join(conflicts)}"
                             f"{advice}")
        if self.evaluate.layerwise or self.evaluate.backend != "torch":
            raise ValueError(f"{where}: a {family} model is scored on torch at its last layer: evaluate.layerwise and "
                             "evaluate.backend (onnx, openvino) do not apply to it")

    def _valid_select(self) -> None:
        if self.evaluate.yardstick is None:
            raise ValueError("select: the search ranks candidates on the yardstick, set "
                             "`evaluate.yardstick` (`{}` for the defaults)")
        # the defaults for either kind of base: which one training starts from is known once its config is read
        kinds = [self.select.candidate_recipes(self.summaries is not None, self.queries is not None, decoder)
                 for decoder in (False, True)]
        trained = [r for recipes in kinds for name in recipes for r in recipes_of(name)]
        for recipe in map(RECIPES.get, dict.fromkeys(trained)):  # a chain's stages: each recipe once
            if (needs := recipe.needs) and getattr(self, needs) is None:
                raise ValueError(f"select.recipes: {recipe.name} trains on LLM {needs}, add a `{needs}` section "
                                 f"(`{needs}: {{}}` for the defaults)")
            if recipe.margins and not self.negatives.cross_encoder:
                raise ValueError(f"select.recipes: {recipe.name} learns a cross-encoder's margins, set "
                                 "`negatives.cross_encoder`")
        for family in self.select.families:
            self._valid_select_family(family, kinds)
        try:
            rung_steps(self.select.budget, max(len(self.select.candidates(k)) for k in kinds), self.select.eta)
        except ValueError as e:
            raise ValueError(f"select.budget: {e}") from None
        if self.model.pretrain:
            raise ValueError("select: the search starts every candidate from the model itself; "
                             "`model.pretrain` is for `embforge run`")

    def _valid_select_family(self, family: str, kinds: list[list[str]]) -> None:
        """A family other than dense among select's: some candidate recipe trains it, the train settings allow it, the
        yardstick named ranks it (`auto` takes one that does: tasks/yardstick.py), and the answer is not distilled."""
        if family == "dense":
            return
        if not all(any(f == family for *_, f in self.select.candidates(recipes)) for recipes in kinds):
            raise ValueError(f"select.families: no candidate recipe trains the {family} family; it trains "
                             f"{', '.join(sorted(FAMILIES[family].recipes))} (not a chained recipe)")
        self._family_trained_and_scored("select.families", family, getattr(self.select, family), self.train)
        kind = self.evaluate.yardstick.kind
        if FAMILIES[family].per_token and kind != "auto" and not ranks_per_token(kind, kind):
            raise ValueError(f"select.families: a {family} model is ranked by MaxSim on your qrels, labels, titles or "
                             f"an LLM's queries, not on the {kind} yardstick (evaluate.yardstick.kind)")
        if self.select.static:
            raise ValueError(f"select.static: a static model is distilled from a dense one; with the {family} family "
                             "among select.families the answer may not be")

    def train_for(self, method: MethodConfig, where: str = "train") -> TrainConfig:
        """The `train` section with the method's own overrides applied and checked."""
        return merged_train(self.train, method, where)
