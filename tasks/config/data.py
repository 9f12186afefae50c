"""The corpus (`data`) and how it is split into sentences (`sentences`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SerializationInfo, field_serializer, model_validator

from tasks.config.base import Section, keying

# The embedded default's data, shipped in the repository: the demo corpus and STS-B (configs/data/README.md).
DEMO_DATA = Path(__file__).resolve().parents[2] / "configs" / "data"
DEMO_DOCS = DEMO_DATA / "ohsumed_demo.parquet"
DEMO_STSB = DEMO_DATA / "stsb.parquet"


class ColumnMap(Section):
    """Which input column is which. The text column must be there; any other column is used where the file has it
    and is an error where it is missing only if the config names it (a default the file lacks is left out: no
    titles, no labels, ids from the rows)."""

    id: str = Field("doc_id", description="Column holding a unique document id (default: used if present, else "
                    "each document's row number, `<file>:<row>` in a folder of files).")
    text: str = Field("text", description="Column holding the document text (e.g. the abstract).")
    title: str | None = Field("title", description="Optional title column (default: used if present).")
    label: str | None = Field("label", description="Optional class label column, used by kNN accuracy and the "
                              "labels yardstick (default: used if present).")
    split: str | None = Field("split", description="Optional split column (train/test/...), kept as is (default: "
                              "used if present).")

    def required(self, field: str) -> bool:
        """Whether a missing column `field` is an error: the text's always, another only where the config names it."""
        return field == "text" or field in self.model_fields_set


class DataConfig(Section):
    path: str | None = Field(None, description="Parquet, CSV or JSONL file, or a folder of them and of .txt/.md "
                             "files (one document each: its path in the folder is its id, a Markdown file's first "
                             "`# heading` its title). Relative paths are resolved against the config file's folder.")
    hf_dataset: str | None = Field(None, description="A `datasets` name or path, used instead of `path`.")
    hf_split: str = Field("train", description="Split to load from `hf_dataset`.")
    streaming: bool = Field(False, exclude=True, description="Read `hf_dataset` as a stream instead of "
                            "downloading it first (the documents are the same, so it is not part of "
                            "the stage's identity).")
    name: str | None = Field(None, description="Dataset name shown in reports (default: file or dataset name).")
    columns: ColumnMap = Field(default_factory=ColumnMap, description="Which input column is which.")
    limit: int | None = Field(None, gt=0, description="Use only the first N documents (quick trials).")
    strip_mail: bool = Field(False, description="Remove who wrote a mail or forum post from every text before "
                             "anything reads it: attribution lines (`In article <...>, someone@host writes:`) and "
                             "e-mail addresses, whitespace made single spaces; a text that would be left empty is "
                             "kept as it is (an attribution line ending in a Windows \\r\\n is kept: the rule as "
                             "measured on 20 Newsgroups). The ingest log counts the documents with an attribution "
                             "line and suggests this where they are many.")
    strip_quotes: bool = Field(False, description="With `strip_mail`, remove quoted lines too (starting with `>`, `|` "
                               "or `:`, so Markdown tables too). Quotes are mostly on topic: on 20 Newsgroups kNN "
                               "accuracy was higher with them kept (docs/select.md).")

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if (self.path is None) == (self.hf_dataset is None):
            raise ValueError("give exactly one of `path` or `hf_dataset`")
        if self.strip_quotes and not self.strip_mail:
            raise ValueError("strip_quotes: removes quoted lines with `strip_mail`; set `strip_mail: true` too")
        return self

    @property
    def display_name(self) -> str:
        return self.name or Path(self.path or self.hf_dataset or "data").stem

    @property
    def local(self) -> Path | None:
        """The corpus's file or folder on this machine (None: a Hub dataset, by its name): the ingest stage keys it
        by its bytes."""
        source = Path(self.path or self.hf_dataset)
        return source if source.exists() else None

    @field_serializer("path", "hf_dataset")
    def _path(self, path: str | None, info: SerializationInfo) -> str | None:
        # A local corpus keys the ingest stage by its bytes (tasks/ingest.py's digest), so its folder is not part of
        # the key: a file moved or copied elsewhere is still cached. Its name is (the reports name the corpus by it).
        if path is not None and keying(info) and self.local is not None:
            return Path(path).name
        return path


class SentenceConfig(Section):
    splitter: Literal["paper", "blingfire"] = Field(
        "paper", description="`paper`: text.split('.') exactly as the cropping paper; "
        "`blingfire`: a real sentence splitter (keeps abbreviations and decimals intact).")
    min_chars: int = Field(100, ge=0, description="Keep a sentence only if it has at least this many "
                           "characters (measured before stripping, as in the paper).")
    max_chars: int = Field(250, gt=0, description="... and at most this many characters.")
    workers: int | None = Field(None, ge=1, exclude=True, description="Processes that split; the flows set it "
                                "from `run.workers` (the sentences are the same, so it is not part of the "
                                "stage's identity).")

    @model_validator(mode="after")
    def _range(self) -> SentenceConfig:
        if self.min_chars > self.max_chars:
            raise ValueError("min_chars must not exceed max_chars")
        return self
