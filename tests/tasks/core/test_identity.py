"""Derived stage identity: editing any first-party module a stage imports changes its key, editing
any other leaves it alone. The ground truth is what Python really imports (recorded in a fresh
process), not the import walker under test."""

import contextlib
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from tasks.config.data import DataConfig
from tasks.core import identity
from tasks.core.stage import STAGES, NoInputs
from tests.helpers import DEMO_DOCS, REPO

ALL_STAGES = {"ingest", "sentences", "pairs", "tokens", "llm", "summarize", "queries", "negatives", "init", "train",
              "merge", "text_tokens", "embed", "evaluate", "semantic", "mteb", "static", "speed", "latency", "report",
              "yardstick", "sample", "select"}
# Stages that load no model: their keys must cover neither the model loader nor the recipes' code.
LOADS_NO_MODEL = {"ingest", "sentences", "pairs", "sample", "yardstick", "select", "report"}
MODEL_LOADER, RECIPE_CODE = "tasks.encoders.models", "tasks.methods"
COUNTS_HEADING = "### The modules each stage's key covers"
FIRST_PARTY_FILES = sorted(p for package in identity.FIRST_PARTY for p in (REPO / package).rglob("*.py"))

# Records every import statement executed while the stage modules load: importer → imported.
RECORD_IMPORTS = """
import builtins, importlib, json, sys
first_party = lambda name: name.split(".")[0] in ("flows", "tasks", "storage")
edges, real_import = {}, builtins.__import__

def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__", "")
    target = importlib.util.resolve_name("." * level + name, globals["__package__"]) if level else name
    parts = target.split(".")
    names = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    names |= {f"{target}.{item}" for item in fromlist or () if f"{target}.{item}" in sys.modules}
    edges.setdefault(importer, set()).update(n for n in names if first_party(n))
    return module

builtins.__import__ = recording_import
for name in sys.argv[1:]:
    importlib.import_module(name)
builtins.__import__ = real_import

def reachable(start):
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += edges.get(current, ())
    return sorted(seen)

print(json.dumps({name: reachable(name) for name in sys.argv[1:]}))
"""


def import_every_stage() -> None:
    for module in pkgutil.walk_packages(tasks.__path__, "tasks."):
        importlib.import_module(module.name)


@pytest.fixture(scope="module")
def imported() -> dict[str, list[str]]:
    """Stage module → the first-party modules importing it really loads, itself included."""
    import_every_stage()
    modules = sorted({STAGES[name].build.__module__ for name in ALL_STAGES})
    out = subprocess.run([sys.executable, "-c", RECORD_IMPORTS, *modules], cwd=REPO, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def edited(monkeypatch: pytest.MonkeyPatch, path: Path):
    """`path` as if someone had added a line to it."""
    real = identity.read_source
    with monkeypatch.context() as m:
        m.setattr(identity, "read_source", lambda p: real(p) + (b"\n# edited\n" if p == path else b""))
        identity.code_version.cache_clear()
        yield
    identity.code_version.cache_clear()


def test_every_stage_is_registered():
    import_every_stage()
    assert ALL_STAGES == set(STAGES)  # a new stage is added here, so that its code version is tested too


@pytest.mark.parametrize("name", sorted(ALL_STAGES))
def test_editing_what_a_stage_imports_changes_its_code_version_and_nothing_else_does(name, imported, monkeypatch):
    stage = STAGES[name]
    before = stage.code_version
    loaded = {identity.module_file(m) for m in imported[stage.build.__module__]} - {None}
    assert identity.module_file("tasks.config") in loaded and identity.module_file(stage.build.__module__) in loaded
    for path in sorted(loaded):
        with edited(monkeypatch, path):
            assert stage.code_version != before, f"editing {path.relative_to(REPO)} left {name}'s key unchanged"
    unrelated = [p for p in FIRST_PARTY_FILES if p not in set(identity.module_closure(stage.build.__module__).values())]
    assert identity.module_file("flows.cli") in unrelated  # the CLI is no stage's code
    for path in unrelated:
        with edited(monkeypatch, path):
            assert stage.code_version == before, f"editing {path.relative_to(REPO)} changed {name}'s key"


def test_a_reference_models_embeddings_depend_on_the_model_loading_code(monkeypatch):
    """The case hand-kept lists got wrong: embed reads an external model through tasks/encoders/models.py."""
    import_every_stage()
    with edited(monkeypatch, identity.module_file("tasks.encoders.models")):
        edited_version = STAGES["embed"].code_version
    assert edited_version != STAGES["embed"].code_version


def test_the_key_hashes_the_code_version(monkeypatch):
    ingest, config = STAGES["ingest"], DataConfig(path=str(DEMO_DOCS))
    before = ingest.ref(config, NoInputs())
    with edited(monkeypatch, identity.module_file("tasks.config.data")):
        assert ingest.ref(config, NoInputs()) != before
    assert ingest.ref(config, NoInputs()) == before


def test_relative_imports_and_packages_are_followed():
    names = identity._imported_names(b"from . import knn\nfrom ..methods.tsdae import delete_words\n",
                                     "tasks.metrics")
    assert {"tasks.metrics.knn", "tasks.methods.tsdae", "tasks.methods", "tasks"} <= names


def model_or_recipe_code(module: str) -> list[str]:
    """The model loader and the recipes' code (their losses, the training loop) among the modules `module` hashes."""
    return sorted(m for m in identity.module_closure(module)
                  if m in (MODEL_LOADER, RECIPE_CODE) or m.startswith(RECIPE_CODE + "."))


def test_a_stage_that_loads_no_model_hashes_neither_the_model_loader_nor_the_recipes_code():
    """Editing a loss or the model loader rebuilds no corpus, training view, split, sample, decision or report."""
    import_every_stage()
    found = {name: model_or_recipe_code(STAGES[name].build.__module__) for name in LOADS_NO_MODEL}
    assert {name: modules for name, modules in found.items() if modules} == {}
    assert "tasks.methods.objectives" in model_or_recipe_code(STAGES["train"].build.__module__)  # it can find some
    for name in ("ingest", "sentences", "pairs"):  # `storage` does not import the catalog
        assert "storage.catalog" not in identity.module_closure(STAGES[name].build.__module__), name


def stage_counts(markdown: str) -> dict[str, int]:
    """docs/stages.md's table of the modules each stage's key covers: stage → count."""
    section = markdown.partition(COUNTS_HEADING)[2].split("\n#", 1)[0]
    return {cells[0].strip("` "): int(cells[1]) for line in section.splitlines() if line.startswith("| `")
            for cells in [line.strip("|").split("|")]}


def test_the_docs_give_the_modules_each_stages_key_covers():
    import_every_stage()
    modules = {name: stage.build.__module__ for name, stage in STAGES.items()}
    counted = {name: len(identity.module_closure(module)) for name, module in modules.items()}
    rows = "\n".join(f"| `{name}` | {counted[name]} | {len(model_or_recipe_code(modules[name]))} |"
                     for name in sorted(counted))
    assert stage_counts((REPO / "docs/stages.md").read_text()) == counted, (
        f"docs/stages.md, under {COUNTS_HEADING!r}, should read:\n{rows}")


def test_training_does_not_depend_on_the_evaluation_settings():
    """Editing `evaluate` (a yardstick kind, a description) trains nothing again: training views and training read
    only which documents are held out (tasks/config/splits.py)."""
    import_every_stage()
    for name in ("pairs", "train"):
        closure = identity.module_closure(STAGES[name].build.__module__)
        assert "tasks.config.splits" in closure and "tasks.config.evaluation" not in closure, name
    assert "tasks.config.evaluation" in identity.module_closure(STAGES["evaluate"].build.__module__)


def test_library_versions_follow_what_the_stage_imports():
    import_every_stage()
    assert identity.libraries_used("tasks.ingest") == ()
    assert set(identity.libraries_used("tasks.train")) == {"torch", "transformers", "sentence-transformers"}
    assert "mteb" in identity.libraries_used("tasks.mteb") and "vllm" in identity.libraries_used("tasks.summarize")
    now = identity.library_versions("tasks.mteb")
    assert all(now[lib] for lib in ("torch", "transformers", "sentence-transformers", "mteb"))
    assert identity.version_changes(now, "tasks.mteb") == {}
    older = {**now, "torch": "1.0.0", "vllm": "0.0.1"}  # vllm: not the mteb stage's business
    assert identity.version_changes(older, "tasks.mteb") == {"torch": ["1.0.0", now["torch"]]}
    assert set(identity.version_changes(None, "tasks.mteb")) == set(now)  # recorded before versions were


def test_a_stage_keeps_the_code_version_of_the_source_it_was_loaded_from(tmp_path, monkeypatch):
    """Editing a stage's source during a long run must not key what the loaded, older code builds
    as the edited code's artifact."""
    source = tmp_path / "stage_edited_while_running.py"
    source.write_text("from tasks.core.stage import Stage\n\n"
                      "def build(*args):\n    pass\n\nSTAGE = Stage('edited-while-running', build)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("tasks.core.stage.STAGES", dict(STAGES))  # the registry as it was, after the test
    module = importlib.import_module("stage_edited_while_running")
    loaded = identity.code_version.__wrapped__("stage_edited_while_running")  # uncached: the source as loaded
    source.write_text(source.read_text() + "# edited after the stage was loaded\n")
    assert identity.code_version.__wrapped__("stage_edited_while_running") != loaded  # the edit is seen afresh
    assert module.STAGE.code_version == loaded  # first asked after the edit, as a long run's later stage is
    monkeypatch.delitem(sys.modules, "stage_edited_while_running")
