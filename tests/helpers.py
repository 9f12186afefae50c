"""Constants and config builders the tests share (fixtures stay in conftest.py)."""

import atexit
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tasks.config.data import DEMO_DATA, DEMO_DOCS, DEMO_STSB, DataConfig

REPO = Path(__file__).resolve().parents[1]
STSB = DEMO_STSB
# In the test server's environment; must never show up in anything it writes.
SECRET = "hf_embforge_test_secret_never_logged"


def mixed_lengths(n: int = 24) -> list[str]:
    """The first n demo abstracts cut to 1 to 4 of their sentences: texts of very different lengths, so most rows
    of a batch are padded."""
    docs = pd.read_parquet(DEMO_DOCS, columns=["text"])["text"].head(n)
    return [". ".join(doc.split(". ")[: 1 + i % 4]) for i, doc in enumerate(docs)]


def process_folder(prefix: str) -> Path:
    """A new temporary folder that lasts as long as this test process."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def tiny_sts() -> Path:
    """Every 5th STS-B test pair (276 of 1,379, every genre): the tiny runs' STS set, written once per test
    process. Embedding and tokenizing all 2,758 sentences for each model was a tenth of a tiny run."""
    folder = process_folder("embforge-tiny-sts-")
    pairs = pd.read_parquet(STSB).query("split == 'test'").iloc[::5]
    pairs.to_parquet(folder / "stsb_test_every_5th.parquet", index=False)
    return folder / "stsb_test_every_5th.parquet"


def scifact_task(name: str, limit: int, corpus_limit: int | None = 100) -> dict:
    """The local SciFact retrieval task of configs/data (evaluate.mteb.local's fields): its first `limit` claims,
    against about `corpus_limit` of its 2,000 abstracts (every relevant one kept)."""
    return {"name": name, "type": "retrieval", "path": str(DEMO_DATA / "scifact_test.parquet"),
            "queries": str(DEMO_DATA / "scifact_test_queries.parquet"), "limit": limit, "corpus_limit": corpus_limit}


def tiny_config(tmp_path: Path, **overrides) -> Path:
    """A config that runs the whole pipeline in well under a minute on 2 cores."""
    cfg = {
        "name": "tiny",
        "store": str(tmp_path / "store"),
        "data": {"path": str(DEMO_DOCS), "name": "ohsumed-tiny", "limit": 150},
        "model": {"random_init": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64}},
        "methods": [{"name": "crops", "recipe": "crops"}, {"name": "dropout", "recipe": "dropout"}],
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 64, "checkpoint_every": 2},
        # t-SNE of a sample of 50 (its sampled path; 150 documents cost ~0.4 s of CPU a model)
        "evaluate": {"max_length": 64, "knn": {"repeats": 3}, "sts": {"path": str(tiny_sts())}, "tsne_max": 50},
    }
    for section, value in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@functools.cache
def migrated_prefect_home() -> Path:
    """A PREFECT_HOME whose SQLite database a temporary Prefect server created and migrated: once per test process."""
    home = process_folder("embforge-prefect-home-")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(home)}
    subprocess.run([sys.executable, "-c", "from flows.api import prefect_api\nwith prefect_api(): pass"], cwd=REPO,
                   env=env, check=True, capture_output=True, timeout=300)
    return home


def prefect_home(folder: Path) -> Path:
    """`folder` as a PREFECT_HOME: if new, made one that holds an empty, migrated Prefect database (each server
    started on an empty home spends ~5 s of one core migrating it); if there, as the runs before left it. (The
    `uninterrupted` run of test_guarantees.py starts from an empty home, as a user's first run does.)"""
    if not folder.exists():
        shutil.copytree(migrated_prefect_home(), folder)
    return folder


def cli_env(home: Path, api: str | None = None, **env_vars: str) -> dict[str, str]:
    """The environment of an `embforge` command in a test: PREFECT_HOME `home` (made as prefect_home makes it),
    offline. Without `api` a run starts a temporary Prefect server of its own, as a user's run does; with it
    (the `prefect_api` fixture) it reports to that server, which saves ~5 s of CPU a run, for the tests that
    are not about the temporary server."""
    env = {**os.environ, "PREFECT_HOME": str(prefect_home(home)), "HF_HUB_OFFLINE": "1", **env_vars}
    env.pop("PREFECT_API_URL", None)
    return env | ({"PREFECT_API_URL": api} if api else {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(url: str, proc: subprocess.Popen, log: Path, name: str, timeout_s: float = 120) -> None:
    """Wait until the server started as `proc` answers `url` (any HTTP answer, an error too);
    fail with the end of its log if it exits or does not answer in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:  # an error answer (an S3 server without credentials): it is up
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not come up:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


def straight_and_resumed(train, straight: Path, killed: Path, step: int = 7) -> tuple:
    """`train(folder, on_step)` (a training that checkpoints in `folder`, returning (model, history)) run whole in
    `straight`, and in `killed` stopped by a KeyboardInterrupt after `step`, then run again: (whole, resumed)."""
    import pytest

    def crash(entry):
        if entry.step == step:
            raise KeyboardInterrupt("killed")

    whole = train(straight, None)
    with pytest.raises(KeyboardInterrupt):
        train(killed, crash)
    return whole, train(killed, None)


def demo_documents(store, limit: int):
    """The first `limit` demo documents, ingested into `store` (their `ingest` artifact's ref)."""
    from tasks.core.stage import NoInputs
    from tasks.ingest import INGEST

    return INGEST.run(store, DataConfig(path=str(DEMO_DOCS), limit=limit), NoInputs())


def tiny_encoder(folder: Path, dropout: float) -> str:
    """A random 1-layer, 32-wide BERT sentence encoder saved in `folder`, with this dropout rate."""
    from tasks.config.model import ModelConfig, RandomInitConfig
    from tasks.encoders.models import save_random_encoder

    save_random_encoder(ModelConfig().name_or_path, RandomInitConfig(layers=1, hidden=32, heads=2, intermediate=64),
                        folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": dropout,
                                                    "attention_probs_dropout_prob": dropout}))
    return str(folder)


def with_masked_lm_head(encoder: str, folder: Path) -> str:
    """`encoder` copied to `folder` with a masked-LM head drawn from seed 0 saved in it: SPLADE's kind of base, where
    no package ships a masked-LM checkpoint."""
    import shutil

    import torch
    from transformers import AutoModelForMaskedLM

    shutil.copytree(encoder, folder)
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_pretrained(encoder).save_pretrained(folder)
    return str(folder)


def decoder_tokenizer(folder: Path, texts: list[str]) -> str:
    """A byte-level BPE tokenizer of 400 tokens learnt from `texts`, saved in `folder`: a decoder's (BOS and EOS,
    no padding or mask token), in 2 s, where SmolLM2's takes ~40 s to read from its GGUF."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return str(folder)


def tiny_decoder(folder: Path) -> str:
    """A random 2-layer, 32-wide Llama with decoder_tokenizer's tokenizer, saved in `folder`."""
    from tasks.config.model import RandomInitConfig
    from tasks.encoders.models import save_random_encoder

    tokenizer = decoder_tokenizer(folder.with_name(folder.name + "-tokenizer"),
                                  pd.read_parquet(DEMO_DOCS)["text"].head(200).tolist())
    save_random_encoder(tokenizer, RandomInitConfig(architecture="llama", layers=2, hidden=32, heads=4,
                                                    intermediate=64), folder)
    return str(folder)


def write_scores(store, stage: str, key: str, rows: list[dict], tables: dict | None = None, config: dict | None = None,
                 roles: dict | None = None, **common) -> dict:
    """A score artifact holding `rows` (a metrics table) and `tables` (name → pyarrow table), as a stage
    writes it (its manifest's `config` and input `roles`, if given); its report entry."""
    from storage.base import ArtifactRef
    from storage.catalog import metrics_table

    ref = ArtifactRef(stage, key)
    with store.writing(ref, config=config or {}, inputs=[], code_version="v", libraries={}, roles=roles) as out:
        out.write_table("metrics", metrics_table(rows, key=key, **common))
        for name, table in (tables or {}).items():
            out.write_table(name, table)
    return dict(label=common["model"], method="m", key=key)


def no_dropout(model):
    """`model` with every dropout at 0: training steps then compare exactly."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


class RecordedReads(pq.ParquetFile):
    """A pairs file that notes what is read of it."""

    def __init__(self, source):
        super().__init__(source)
        self.columns_read, self.groups_read = [], []

    def read(self, columns=None, **kwargs):
        self.columns_read.append(columns)
        return super().read(columns=columns, **kwargs)

    def read_row_group(self, i, columns=None, **kwargs):
        self.groups_read.append(i)
        return super().read_row_group(i, columns=columns, **kwargs)


def parquet_file(columns: dict | pa.Table, row_group_size: int) -> RecordedReads:
    sink = pa.BufferOutputStream()
    pq.write_table(columns if isinstance(columns, pa.Table) else pa.table(columns), sink, row_group_size=row_group_size)
    return RecordedReads(pa.BufferReader(sink.getvalue()))


def tokens_file(pairs_per_epoch, row_group_size=3) -> tuple[RecordedReads, list[str]]:
    """A tokens file of those pairs (tasks/tokens.py's columns) and its texts: a text's ids are one per word, the
    first its index in the texts, and its words count its words (the tokenizer's are the model's)."""
    from tasks.encoders.inputs import words_column
    texts = [text for pairs in pairs_per_epoch for pair in pairs for text in pair]
    ids = [[i] + [0] * (len(text.split()) - 1) for i, text in enumerate(texts)]
    words = [list(range(len(i))) for i in ids]
    epochs = [epoch for epoch, pairs in enumerate(pairs_per_epoch) for _ in pairs]
    column = lambda lists, side: pa.array(lists[side::2], pa.list_(pa.int32()))  # noqa: E731
    return parquet_file({"epoch": pa.array(epochs, pa.int32()), "anchor": column(ids, 0),
                         words_column("anchor"): column(words, 0), "positive": column(ids, 1),
                         words_column("positive"): column(words, 1)}, row_group_size), texts


def pairs_table(pairs_per_epoch) -> pa.Table:
    """What the pairs stage writes (epoch-major rows)."""
    rows = [(epoch, anchor, positive) for epoch, pairs in enumerate(pairs_per_epoch) for anchor, positive in pairs]
    return pa.table({"epoch": pa.array([r[0] for r in rows], pa.int32()), "doc_id": [f"d{i}" for i in range(len(rows))],
                     "anchor": [r[1] for r in rows], "positive": [r[2] for r in rows]})


def pairs_file(pairs_per_epoch, row_group_size=3) -> RecordedReads:
    """The pairs stage's file, in row groups of `row_group_size` rows."""
    return parquet_file(pairs_table(pairs_per_epoch), row_group_size)


def model_tokens_file(model, pairs_per_epoch, row_group_size=3, word_ids=False) -> RecordedReads:
    """The tokens stage's file of those pairs for `model` (what training reads), in row groups of `row_group_size`."""
    from tasks.tokens import tokenized

    return parquet_file(tokenized(model, pairs_table(pairs_per_epoch), word_ids), row_group_size)


@functools.cache
def deployment_count() -> int:
    """How many deployments `embforge server` registers: flows/server.py's list."""
    from flows.server import deployments

    return len(deployments(str(REPO / "configs" / "demo.yaml")))
