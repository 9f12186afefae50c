"""The layout's rules, checked on every run of the suite, so the house stays walkable as it grows:
no import cycle among the first-party modules, no helper package that imports a stage, and no
module past ~400 lines without a reason stated at its top. Imports are read as the stages' code
identity reads them (tasks/core/identity.py), imports inside functions included."""

import graphlib

import pytest

from tasks.core import identity

MODULES = {
    ".".join(path.relative_to(identity.ROOT).with_suffix("").parts).removesuffix(".__init__"): path
    for package in identity.FIRST_PARTY for path in sorted((identity.ROOT / package).rglob("*.py"))
}
# The stages stand at the top of tasks/, one module each; everything in a sub-package is a helper.
STAGES = {name for name, path in MODULES.items() if path.parent == identity.ROOT / "tasks" and path.stem != "__init__"}
HELPERS = {name for name, path in MODULES.items() if path.parent.parent == identity.ROOT / "tasks"}
MAX_LINES = 400


def imports(name: str) -> set[str]:
    """The first-party modules `name` imports (not the packages above them, whose `__init__` is
    loaded on the way: a package's docstring is no dependency)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = identity._imported_names(identity.read_source(path), package)
    return {n for n in found if n in MODULES and n != name
            and not any(other.startswith(n + ".") for other in found if other in MODULES)}


def test_the_packages_are_found():
    assert {"tasks.train", "tasks.ingest", "tasks.report"} <= STAGES
    assert {"tasks.core.stage", "tasks.config.pipeline", "tasks.config.recipes"} <= HELPERS
    assert {"tasks.config", "tasks.core"} <= HELPERS - STAGES  # packages, not stages


def test_no_import_cycles():
    graph = graphlib.TopologicalSorter({name: imports(name) for name in MODULES})
    try:
        graph.prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_a_helper_package_never_imports_a_stage():
    found = {helper: sorted(imports(helper) & STAGES) for helper in HELPERS}
    assert {helper: stages for helper, stages in found.items() if stages} == {}


def test_the_recipe_registry_holds_data_and_imports_nothing_of_embforge():
    assert imports("tasks.config.recipes") == set()


def test_no_module_is_long_without_a_reason_at_its_top():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES
            and f"over {MAX_LINES} lines" not in path.read_text()[:2000]}
    assert long == {}, f"split these, or say at the top why they are over {MAX_LINES} lines"
