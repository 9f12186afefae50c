"""The layout's rules, checked on every run of the suite, so the house stays walkable as it grows: every package
stands on a floor and imports only from the floors below it (and from itself), no import cycle among the first-party
modules, and no module past 400 lines. Imports are read as the stages' code identity reads them
(tasks/core/identity.py), imports inside functions included."""

import graphlib

import pytest

from tasks.core import identity

MODULES = {
    ".".join(path.relative_to(identity.ROOT).with_suffix("").parts).removesuffix(".__init__"): path
    for package in identity.FIRST_PARTY for path in sorted((identity.ROOT / package).rglob("*.py"))
}
# The floors, from the ground up: a package imports from the floors below its own, never from a package on its
# own floor or above. `tasks` is the stages, the modules at the top of tasks/ (one a stage); every other name is a
# package with what is in it.
FLOORS = (
    ("storage",),  # owns every byte: stores, manifests, the catalog
    ("tasks.config",),  # the config sections and the recipe registry they read: data, no work
    ("tasks.core",),  # what every stage shares: identity, the Stage wrapper, held-out splits, progress
    ("tasks.encoders", "tasks.views"),  # loading and running a model; building training views from text
    ("tasks.generation", "tasks.methods", "tasks.metrics"),  # LLM text, the losses and training loop, the scores
    ("tasks.reporting",),  # tables and plots of the scores
    ("tasks",),  # the stages
    ("flows",),  # the Prefect flows, the server and the command line
)
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}
MAX_LINES = 400


def imports(name: str) -> set[str]:
    """The first-party modules `name` imports (not the packages above them, whose `__init__` is
    loaded on the way: a package's docstring is no dependency)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = identity._imported_names(identity.read_source(path), package)
    return {n for n in found if n in MODULES and n != name
            and not any(other.startswith(n + ".") for other in found if other in MODULES)}


def package_of(name: str) -> str:
    """The floor's package a module belongs to: `tasks.encoders.models` → `tasks.encoders`, the stage `tasks.train`
    → `tasks`, `storage.store` → `storage`."""
    parts = name.split(".")
    if parts[0] == "tasks" and len(parts) > 1 and MODULES.get(f"tasks.{parts[1]}", identity.ROOT).name == "__init__.py":
        return f"tasks.{parts[1]}"
    return parts[0]


def test_the_packages_are_found():
    assert {"tasks.train", "tasks.ingest", "tasks.report", "flows.cli"} <= set(MODULES)
    assert package_of("tasks.train") == "tasks" and package_of("tasks.config.recipes") == "tasks.config"
    assert package_of("tasks.config") == "tasks.config" and package_of("storage.store") == "storage"


def test_every_package_stands_on_one_floor_and_every_floor_holds_a_package():
    packages = {package_of(name) for name in MODULES}
    assert packages - set(FLOOR) == set(), "put the new package on a floor"
    assert set(FLOOR) - packages == set(), "a floor names a package that is gone"


def test_no_import_runs_up_a_floor_or_across_one():
    upward = sorted(f"{name} -> {target}" for name in MODULES for target in imports(name)
                    if package_of(target) != package_of(name) and FLOOR[package_of(target)] >= FLOOR[package_of(name)])
    assert upward == [], "move the code to the floor its imports imply (docs/stages.md#layout)"


def test_the_rule_catches_an_import_up_a_floor(monkeypatch):
    """The rule itself can fail: a config module importing an encoder is reported."""
    real = identity.read_source
    config = MODULES["tasks.config.data"]
    monkeypatch.setattr(identity, "read_source", lambda path: real(path) + (
        b"\nfrom tasks.encoders.models import model_path\n" if path == config else b""))
    with pytest.raises(AssertionError, match="tasks.config.data -> tasks.encoders.models"):
        test_no_import_runs_up_a_floor_or_across_one()


def test_no_import_cycles():
    graph = graphlib.TopologicalSorter({name: imports(name) for name in MODULES})
    try:
        graph.prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_recipe_registry_holds_data_and_imports_nothing_of_embforge():
    assert imports("tasks.config.recipes") == set()


def test_no_module_is_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these: no module is over {MAX_LINES} lines"
