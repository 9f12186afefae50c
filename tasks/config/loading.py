"""Loading an experiment file: YAML, `--set` overrides, file paths relative to the config, and
errors as `file: section.field: message`."""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from pydantic import ValidationError

from storage.base import is_url
from tasks.config.base import ConfigError
from tasks.config.pipeline import PipelineConfig


def _format_error(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if e["type"] not in ("missing",) and not isinstance(e["input"], dict) else ""
        lines.append(f"{path}: {where}: {e['msg']}{got}")
    return "\n".join(lines)


def _resolve(base: Path, value: str | None) -> str | None:
    if value is None or value.startswith("package:"):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _local_model(name: str) -> bool:
    """Whether a model name can only be a path: a `.gguf` file (tasks/llm.py) or a name that is
    no Hub id (`./x`, `/x`, `~/x`, `a/b/c`); `org/model` may be either, `package:` names neither."""
    if name.startswith("package:"):
        return False
    if name.endswith(".gguf"):
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _resolve_model(base: Path, name: str) -> str:
    # A model may be a Hub name ("org/model") or a folder (or GGUF file) next to the config: an
    # existing one, or one that can only be a path, is made absolute.
    return _resolve(base, name) if (base / name).exists() or _local_model(name) else name


def _named_files(cfg: PipelineConfig) -> Iterator[tuple[str, str | None, bool]]:
    """(dotted field, resolved path, whether a folder will do) of every local file the config names.
    Hub names (datasets, models, MTEB tasks) are not files: what they need is checked when loading."""
    yield "data.path", cfg.data.path, True
    if cfg.model.pretrain:
        yield "model.pretrain.data.path", cfg.model.pretrain.data.path, True
    if cfg.evaluate.sts:
        yield "evaluate.sts.path", cfg.evaluate.sts.path, False
    if cfg.evaluate.yardstick:
        yield "evaluate.yardstick.qrels", cfg.evaluate.yardstick.qrels, False
    for i, task in enumerate(cfg.evaluate.mteb.local if cfg.evaluate.mteb else []):
        yield f"evaluate.mteb.local.{i}.path", task.path, False
        yield f"evaluate.mteb.local.{i}.queries", task.queries, False
    models = {"model.name_or_path": cfg.model.name_or_path,
              **{f"evaluate.reference_models.{i}": m for i, m in enumerate(cfg.evaluate.reference_models)},
              **_llms(cfg)}
    for field, name in models.items():
        if name and _local_model(name):
            yield field, name, not name.endswith(".gguf")


def _llms(cfg: PipelineConfig) -> dict[str, str]:
    """Each LLM the config names, by field."""
    return {f"{section}.llm": generation.llm for section, generation in (("summaries", cfg.summaries),
                                                                        ("queries", cfg.queries)) if generation}


def _missing_packages(cfg: PipelineConfig) -> Iterator[tuple[str, str]]:
    """(field, package) of each `package:` LLM that is not installed."""
    for field, name in _llms(cfg).items():
        package = name.removeprefix("package:")
        if name.startswith("package:") and importlib.util.find_spec(package.replace("-", "_")) is None:
            yield field, package


def _check_files(path: Path, cfg: PipelineConfig) -> None:
    # At load time, so a typo fails the command at once rather than the stage that reads the
    # file, possibly hours into a run.
    missing = [f"{path}: {field}: {'file or folder' if folder_ok else 'file'} not found: {value}"
               for field, value, folder_ok in _named_files(cfg)
               if value and not (Path(value).exists() if folder_ok else Path(value).is_file())]
    missing += [f"{path}: {field}: package {package!r} is not installed (pip install --no-deps {package})"
                for field, package in _missing_packages(cfg)]
    if missing:
        raise ConfigError("\n".join(missing))


def apply_overrides(raw: dict, overrides: dict[str, Any], path: Path) -> dict:
    """Set dotted fields (`train.epochs: 1`, `methods.0.train.lr: 1e-4`: a number picks a list
    item) on the raw YAML mapping, before validation, so an override is checked exactly like the
    same field written in the file."""
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node: Any = raw
        for i, part in enumerate([*parents, leaf]):
            where = ".".join(parents[:i])  # the list or section `part` is looked up in
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"{path}: override {dotted}: {where}: no item {part} "
                                      f"(the list has {len(node)})")
                part = int(part)
            elif not isinstance(node, dict):
                raise ConfigError(f"{path}: override {dotted}: {where} is not a section")
            if i == len(parents):
                node[part] = value
            else:
                node = node[part] if isinstance(node, list) else node.setdefault(part, {})
    return raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, check_files: bool = True) -> PipelineConfig:
    """Read and validate a YAML config, with optional dotted-field overrides; relative file paths
    become absolute (config-relative) and must exist (unless `check_files` is off: a command that only
    takes the store from the config reads none of them). Parsed once per (file version, overrides): a
    command and the flow it starts share the result."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    stat = path.stat()
    cfg = _load_config(str(path), str(path.resolve()), stat.st_mtime_ns, stat.st_size,
                       json.dumps(overrides or {}, sort_keys=True, default=str))
    if check_files:
        _check_files(path, cfg)  # on every load, cached or not: the files can go while the config stays
    return cfg


@functools.lru_cache(maxsize=32)
def _load_config(file: str, _resolved: str, _mtime_ns: int, _size: int, overrides_json: str) -> PipelineConfig:
    path, overrides = Path(file), json.loads(overrides_json)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    raw = apply_overrides(raw, overrides, path)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(path, e)) from None
    base = path.resolve().parent
    data = cfg.data.model_copy(update={"path": _resolve(base, cfg.data.path)})
    evaluate = cfg.evaluate
    if evaluate.sts:
        evaluate = evaluate.model_copy(update={"sts": evaluate.sts.model_copy(
            update={"path": _resolve(base, evaluate.sts.path)})})
    if evaluate.mteb:
        local = [t.model_copy(update={"path": _resolve(base, t.path), "queries": _resolve(base, t.queries)})
                 for t in evaluate.mteb.local]
        evaluate = evaluate.model_copy(update={"mteb": evaluate.mteb.model_copy(update={"local": local})})
    if evaluate.yardstick:
        evaluate = evaluate.model_copy(update={"yardstick": evaluate.yardstick.model_copy(
            update={"qrels": _resolve(base, evaluate.yardstick.qrels)})})
    evaluate = evaluate.model_copy(update={"reference_models": [_resolve_model(base, m)
                                                                for m in evaluate.reference_models]})
    model = cfg.model.model_copy(update={"name_or_path": _resolve_model(base, cfg.model.name_or_path)})
    if model.pretrain:
        stage1 = model.pretrain.data
        model = model.model_copy(update={"pretrain": model.pretrain.model_copy(update={
            "data": stage1.model_copy(update={"path": _resolve(base, stage1.path)})})})
    summaries, queries = (section and section.model_copy(update={"llm": _resolve_model(base, section.llm)})
                          for section in (cfg.summaries, cfg.queries))
    return cfg.model_copy(update={"data": data, "model": model, "evaluate": evaluate, "summaries": summaries,
                                  "queries": queries,
                                  "store": cfg.store if is_url(cfg.store) else _resolve(base, cfg.store)})
