"""Yardstick: a held-out share of the corpus made into a retrieval task (`embforge select` ranks recipes by it).

The held-out documents are drawn by a hash of (seed, doc_id) (tasks/core/held_out.py: the same documents whatever
else the corpus holds) and are left out of every training view (tasks/pairs.py, `PairsConfig.yardstick`),
so no candidate trained on them. The kinds, by what the user has (`auto`: qrels where given, else labels if they ask
at least half as many queries as titles (else the held-out documents) would, else titles, else the clusters (the
neighbours where the corpus has too few documents to group; where fewer than MIN_POOL models are ranked,
`YardstickJob.small_pool`, too few to judge each other, an LLM's queries before them, and they only where nothing
else can rank); where a
multi-vector model is among those ranked (`YardstickJob.per_token`), the kinds MaxSim ranks each model on by itself:
qrels, else labels, else titles, else an LLM's queries; the log says why):

- `qrels`, the user's own queries and relevance judgements (a file): each query whose relevant documents (score > 0)
  are all held out asks for them among all the corpus's (nDCG@10, binary gains); one with a relevant document that
  training may see asks nothing (status `trained_on`). The relevant pairs are the artifact's `relevant` table.
- `labels`, the user's own labels: each labelled held-out document is a query, by its own vector, whose relevant
  documents are the labelled documents not held out that share its label (nDCG@10; the evaluate stage scores it).
  A held-out document whose label no other document has asks nothing (status `no_relevant`).
- `titles`, no labels needed: each held-out document that has a title gives a query, its title, whose one relevant
  document is its own text, among all the corpus's.
- `queries`, nothing but the text: the queries stage's LLM writes queries for held-out documents (input `generated`,
  an `AskedQueries` job: the flow asks for it when `llm_queries_needed`); each usable one asks for its own document.
- `consensus`: the titles' queries, else the LLM's (the manifest's `source`), scored across the candidates (the
  select stage's, a report's models: tasks/metrics/pool.py), each against the others' rankings fused.
- `neighbours`, nothing but the text and no LLM: each held-out document asks, by its own vector, for its nearest
  other documents; scored across the candidates like a consensus (the evaluate stage keeps each one's ranking).
- `clusters`, nothing but the text and no LLM: every document of the corpus (those trained on too: none drawn) asks,
  by its own vector, for its 10 nearest others, and scores the share of them in its group of the other candidates'
  k-means grouping (tasks/metrics/pool.py; the evaluate stage keeps each one's neighbours and vectors). The share
  is still held out of training, as for every kind.

At most `max_queries` ask (a sample by a hash of seed and query id; the others are `not_drawn`, still held out), so
a large corpus's yardstick costs what a few thousand documents' does (with `select.sample`, tasks/sample.py).

The output has the queries stage's columns, so the evaluate stage's in-domain retrieval (each query's rank and
nDCG@10) and the report's paired intervals read it as they read generated queries. What each kind needs, asks, its
bias and measured agreement are tasks/config/yardsticks.py's (the select report states them).

Inputs: `documents`, `generated` (the LLM's queries). Output `queries.parquet`: query_id, doc_id (a relevant
document), split (`held_out`), query (the user's query, the label, the title or the LLM's), status; for qrels also
`relevant.parquet` (query_id, doc_id) of the queries that ask; `needed.parquet` (doc_id), the documents its asking
queries cannot be scored without (a sample keeps them); the manifest gives the kind it is, its `source`, how many
documents were held out, how many ask a query and how many documents they need.
"""

from __future__ import annotations

import logging

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from storage.base import ArtifactRef, file_digest, stable_hash
from storage.store import ArtifactStore, ArtifactWriter
from tasks.config.base import InputError
from tasks.config.evaluation import YardstickConfig
from tasks.config.queries import HELD_OUT, QUERY_COLUMNS, TRAIN
from tasks.config.yardsticks import CLUSTERS, KINDS, MIN_POOL, TEXT_QUERIES, YARDSTICKS, carried, ranks_per_token
from tasks.core.eval_sets import read_table
from tasks.core.held_out import held_out_documents
from tasks.core.stage import Inputs, Stage

SCHEMA = pa.schema([(column, pa.string()) for column in QUERY_COLUMNS])  # what the queries' readers read
SHARE = "a larger corpus or a larger held-out share"  # what gives a kind more held-out documents to ask
MIN_QUERIES = 2  # a ranking of candidates needs more than one query to be paired over
NO_RELEVANT = "no_relevant"  # a held-out document whose label no trained-on document has
TRAINED_ON = "trained_on"  # a user's query with a relevant document that is not held out
NOT_DRAWN = "not_drawn"  # a query past `max_queries` (still held out of training)
QRELS_COLUMNS = ["query_id", "query", "doc_id", "score"]


class YardstickJob(YardstickConfig):
    """The yardstick stage's job: the config's yardstick, and whether the models it ranks include one of a vector per
    token (multi-vector: the run's methods, or select's families)."""

    per_token: bool = Field(False, description="A multi-vector model is among those it ranks: `auto` takes only the "
                            "kinds that judge each model by itself, which MaxSim ranks: your qrels, else labels, else "
                            "titles, else queries an LLM writes for the held-out documents.")
    small_pool: bool = Field(False, description="Fewer than MIN_POOL models are ranked on it (a search's candidates "
                             "and the untrained model, a run's models): `auto` takes a pooled kind, whose models "
                             "judge each other, only where nothing else can rank; text alone gets an LLM's queries.")
    single: bool = Field(False, description="Only a label-free kind that scores each model by itself (what a "
                         "pooled kind's decision against the untrained model is confirmed on, `confirm`): `auto` takes "
                         "titles, else queries an LLM writes for the held-out documents.")


class YardstickInputs(Inputs):
    documents: ArtifactRef
    generated: ArtifactRef | None = None  # the LLM's queries for the held-out documents (the `queries` kind)


def label_queries(docs: pa.Table, held: pa.Array) -> tuple[pa.Table, int]:
    """The labels kind's queries: every labelled held-out document (`ok` where a document not held out shares its
    label), and how many labels the documents not held out have."""
    known = pc.unique(docs.filter(pc.and_(pc.invert(held), pc.is_valid(docs["label"])))["label"])
    asked = docs.filter(pc.and_(held, pc.is_valid(docs["label"])))
    status = pc.if_else(pc.is_in(asked["label"], known), "ok", NO_RELEVANT)
    return _queries(_named("label-", asked["doc_id"]), asked["doc_id"], asked["label"], status), len(known)


def qrels_queries(path: str, docs: pa.Table, held: pa.Array) -> tuple[pa.Table, pa.Table]:
    """The qrels kind's queries, one row per query with a relevant document (score > 0; `ok` where every one is held
    out), and the relevant pairs of those that ask. Ids are text as the ingest stage makes them (12 and 12.0: "12")."""
    qrels = read_table(path, QRELS_COLUMNS)
    for column in QRELS_COLUMNS:
        if (missing := qrels[column].isna()).any():
            raise InputError(f"{path}: row {missing.idxmax() + 1}: no {column}")
    score = pd.to_numeric(qrels["score"], errors="coerce")
    if (bad := score.isna()).any():
        raise InputError(f"{path}: row {bad.idxmax() + 1}: score {qrels['score'][bad.idxmax()]!r} is not a number")
    qrels = qrels.assign(**{c: pc.cast(pa.array(qrels[c]), pa.string()).to_pylist() for c in ("query_id", "doc_id")})
    qrels = qrels[score > 0]
    if qrels.empty:
        raise InputError(f"{path}: no row with score > 0: no query has a relevant document")
    if not (blank := qrels[qrels["query"].astype(str).str.strip() == ""]).empty:
        raise InputError(f"{path}: row {blank.index[0] + 1} (query {blank['query_id'].iloc[0]!r}): the query is empty")
    if not (unknown := qrels[~qrels["doc_id"].isin(docs["doc_id"].to_pylist())]).empty:
        doc, query = unknown.iloc[0][["doc_id", "query_id"]]
        raise InputError(f"{path}: doc_id {doc!r} (query {query!r}) is not in the corpus")
    held_ids = set(docs.filter(held)["doc_id"].to_pylist())
    asks = qrels["doc_id"].isin(held_ids).groupby(qrels["query_id"], sort=False).all()
    first = qrels.drop_duplicates("query_id")
    status = pa.array(first["query_id"].map(asks).map({True: "ok", False: TRAINED_ON}).tolist(), pa.string())
    queries = _queries(*(pa.array(first[c].astype(str).tolist(), pa.string()) for c in ("query_id", "doc_id", "query")),
                       status)
    relevant = qrels[qrels["query_id"].map(asks)][["query_id", "doc_id"]].drop_duplicates()
    return queries, pa.Table.from_pandas(relevant, preserve_index=False)


def title_queries(docs: pa.Table, held: pa.Array) -> pa.Table:
    """The titles kind's queries: every held-out document that has a title."""
    asked = docs.filter(pc.and_(held, pc.is_valid(docs["title"])))  # the ingest stage made blank titles null
    return _queries(_named("title-", asked["doc_id"]), asked["doc_id"], asked["title"],
                    pa.array(["ok"] * asked.num_rows, pa.string()))


def neighbour_queries(docs: pa.Table, held: pa.Array) -> pa.Table:
    """The neighbours kind's queries: every held-out document, asking by its own vector (its query: its id)."""
    asked = docs.filter(held)["doc_id"]
    return _queries(_named("doc-", asked), asked, asked, pa.array(["ok"] * len(asked), pa.string()))


def cluster_queries(docs: pa.Table, held: pa.Array) -> pa.Table:
    """The clusters kind's queries: every document (its query: its id), in its split (held out or trained on)."""
    return _queries(_named("doc-", docs["doc_id"]), docs["doc_id"], docs["doc_id"],
                    pa.array(["ok"] * docs.num_rows, pa.string()), split=pc.if_else(held, HELD_OUT, TRAIN))


def _named(prefix: str, doc_ids: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(prefix, doc_ids, "")


def _queries(query_ids: pa.Array, doc_ids: pa.Array, query: pa.Array, status: pa.Array,
             split: pa.Array | None = None) -> pa.Table:
    """The queries table; every query held out unless `split` says otherwise (the clusters' trained-on documents)."""
    split = pa.array([HELD_OUT] * len(doc_ids), pa.string()) if split is None else split
    return pa.table({"query_id": query_ids, "doc_id": doc_ids, "split": split, "query": query, "status": status},
                    schema=SCHEMA)


def generated_queries(store: ArtifactStore, generated: ArtifactRef, held: set[str]) -> pa.Table:
    """The queries kind's queries: every usable query an LLM wrote for a held-out document (the queries stage's
    `AskedQueries` job), asking for that document."""
    table = store.read_table(generated, "queries", columns=["query_id", "doc_id", "query", "status"])
    table = table.filter(pc.and_(pc.equal(table["status"], "ok"), pc.is_in(table["doc_id"], pa.array(sorted(held)))))
    return _queries(table["query_id"], table["doc_id"], table["query"], table["status"])


def llm_queries_needed(cfg: YardstickJob, counts: dict, documents: int) -> bool:
    """Whether the yardstick asks by an LLM's queries (the flow then has them written first), from the ingest stage's
    counts (`titled`, `labelled`) of its `documents`: `queries`; `consensus` on a corpus without titles (`titled`:
    fewer than half its documents have one); `auto` on one without titles where only a kind of one model will do
    (`single`: labels are not asked, and your queries were too few for the pooled kind to decide), or, without your
    queries, where a multi-vector model is ranked or too few models are to judge each other and fewer than half the
    documents have a label (a few labels may ask too few, or be dropped for the queries; else `auto` falls back on
    the clusters)."""
    untitled = not carried(counts.get("titled", 0), documents)
    if cfg.kind == "queries" or (cfg.kind == "consensus" and untitled):
        return True
    labelled = carried(counts.get("labelled", 0), documents)
    return cfg.kind == "auto" and untitled and (cfg.single or not cfg.qrels and (cfg.per_token or cfg.small_pool)
                                                 and not labelled)


def build_yardstick(store: ArtifactStore, cfg: YardstickJob, inputs: YardstickInputs,
                    out: ArtifactWriter, ref: ArtifactRef, log: logging.Logger) -> None:
    docs = store.read_table(inputs.documents, "documents", columns=["doc_id", "title", "label"])
    ids = held_out_documents(docs["doc_id"].to_pylist(), cfg)
    held = pc.is_in(docs["doc_id"], pa.array(sorted(ids), pa.string()))
    fraction = cfg.share(docs.num_rows)
    among = f"of the {len(ids)} held-out documents ({fraction:.0%} of the corpus)"
    found = {}  # kind → (its queries, how many ask) where it can rank, or why not
    relevant = None
    by_text = cfg.kind == "auto" and cfg.per_token  # MaxSim ranks each model by itself: no pooled kind
    if by_text:
        automatic = {k for k in KINDS if ranks_per_token(k, k)}
    elif cfg.single:  # a pooled kind's confirmation: label-free as the pooled kinds, and no pool judges it
        automatic = set(TEXT_QUERIES)
    else:  # where too few models are ranked to judge each other, the LLM's queries before the pooled kinds
        automatic = {"labels", "titles", "clusters", "neighbours"} | ({"queries"} if cfg.small_pool else set())
    wants = {cfg.kind} | (automatic if cfg.kind == "auto" else set()) | (
        set(TEXT_QUERIES) if cfg.kind == "consensus" else set())
    titles = docs.num_rows - docs["title"].null_count
    if cfg.kind != "titles" and "titles" in wants and not carried(titles, docs.num_rows):
        wants.discard("titles")
        found["titles"] = (f"titles: {titles} of the {docs.num_rows} documents have a title, fewer than half: "
                           "`kind: titles` asks them" if titles else
                           f"titles: none of the {docs.num_rows} documents has a title: a title column "
                           "(data.columns.title)")
        if titles:
            log.info("%d of the %d documents have a title, fewer than half: the corpus is taken as text alone "
                     "(`kind: titles` asks them)", titles, docs.num_rows)
    if by_text:
        log.info("a multi-vector model is among those ranked: your qrels, labels, titles or an LLM's queries decide "
                 "(each model ranked by itself, by MaxSim), not the pooled kinds")
    few = f"fewer than {MIN_POOL} models are ranked (the candidates and the untrained model)"
    if cfg.small_pool and cfg.kind == "auto" and not by_text:
        log.info("%s: a pooled kind, whose models judge each other, decides only where nothing else can", few)
    if cfg.qrels:
        queries, relevant = qrels_queries(cfg.qrels, docs, held)
        asking = pc.count_distinct(relevant["query_id"]).as_py()
        found["qrels"] = (queries, asking) if asking >= MIN_QUERIES else (
            f"qrels: {asking} of the {queries.num_rows} queries of {cfg.qrels} have every relevant document among "
            f"the {len(ids)} held-out documents ({fraction:.0%} of the corpus); it needs at least {MIN_QUERIES}: more "
            "queries or a larger held-out share")
    if "labels" in wants:
        queries, labels = label_queries(docs, held)
        asking = pc.sum(pc.equal(queries["status"], "ok")).as_py() or 0
        found["labels"] = (queries, asking) if asking >= MIN_QUERIES and labels >= 2 else (
            f"labels: {asking} {among} have a label that a document not held out shares, among {labels} labels; it "
            f"needs at least {MIN_QUERIES} and 2 labels: more labelled documents or a larger held-out share")
    if "titles" in wants:
        queries = title_queries(docs, held)
        found["titles"] = (queries, queries.num_rows) if queries.num_rows >= MIN_QUERIES else (
            f"titles: {queries.num_rows} {among} have a title; it needs at least {MIN_QUERIES}: {SHARE}")
    if "queries" in wants and inputs.generated:
        queries = generated_queries(store, inputs.generated, ids)
        found["queries"] = (queries, queries.num_rows) if queries.num_rows >= MIN_QUERIES else (
            f"queries: the LLM wrote {queries.num_rows} usable queries for the {len(ids)} held-out documents; it needs "
            f"at least {MIN_QUERIES}: {SHARE}, or more queries a document (queries.sampling.n)")
    if "neighbours" in wants:
        queries = neighbour_queries(docs, held)
        found["neighbours"] = (queries, queries.num_rows) if queries.num_rows >= MIN_QUERIES else (
            f"neighbours: {queries.num_rows} held-out documents ({fraction:.0%} of the corpus); it needs at least "
            f"{MIN_QUERIES}: {SHARE}")
    if "clusters" in wants:
        found["clusters"] = (cluster_queries(docs, held), docs.num_rows) if docs.num_rows > CLUSTERS else (
            f"clusters: {docs.num_rows} documents; it needs more than {CLUSTERS} (its groups): a larger corpus")
    usable = {k: v for k, v in found.items() if isinstance(v, tuple)}
    if not usable:  # each reason ends with what would let its kind rank
        raise InputError(f"yardstick {'; '.join(found.values()) or 'of kind ' + cfg.kind}"
                         + ("; or `select.confirm: false`, to let the pooled kind decide against the "
                            "untrained model alone" if cfg.single else ""))
    # The user's queries first; then their labels, unless so few carry them that a paired interval over them would
    # say little; then titles; then the clusters (text alone: they agree with labels best of the label-free kinds at
    # 2,000 documents, docs/select.md), the neighbours where a corpus is too small to group; in a small pool the
    # LLM's queries before them, a pooled kind only where nothing else can rank (nor rival the labels). A consensus
    # fuses rankings of titles, else the LLM's queries.
    asks = {k: asking for k, (_, asking) in usable.items()}
    order = [k for k in ("qrels", "labels", "titles", "clusters", "neighbours", "queries") if k in usable]
    if cfg.small_pool:
        order.sort(key=lambda k: YARDSTICKS[k].pooled)  # stable: the others keep their order
    after = next((k for k in order if k in ("titles", "clusters", "neighbours", "queries")
                  and not (cfg.small_pool and YARDSTICKS[k].pooled)), None)
    rival = len(ids) if after and YARDSTICKS[after].every_document else asks.get(after)  # held-out askers, as labels'
    if "labels" in order and after and 2 * asks["labels"] < rival:
        order.remove("labels")
        log.info("the %s decide: %d labelled held-out documents ask, against %d", after, asks["labels"], rival)
    source = next(k for k in (TEXT_QUERIES if cfg.kind == "consensus" else order) if k in usable)
    if cfg.qrels and source != "qrels":
        log.warning("your queries cannot decide (%s); the %s do", found["qrels"], source)
    elif cfg.kind == "auto" and source != order[0]:
        log.info("the %s decide: %s", source, found.get(order[0]))
    queries, asking = usable[source]
    if cfg.max_queries and asking > cfg.max_queries and not YARDSTICKS[source].every_document:
        queries = drawn(queries, cfg)
        log.info("%d of the %d queries drawn to ask (evaluate.yardstick.max_queries)", cfg.max_queries, asking)
        asking = cfg.max_queries
    out.write_table("queries", queries)
    asked = queries.filter(pc.equal(queries["status"], "ok"))
    if source == "qrels":
        relevant = relevant.filter(pc.is_in(relevant["query_id"], asked["query_id"]))
        out.write_table("relevant", relevant)
    # what a sample of the corpus must keep (tasks/sample.py): each asking query's relevant documents, or its own; none
    # where every document asks (each asks among the sample)
    needed = (pa.array([], pa.string()) if YARDSTICKS[source].every_document else
              pc.unique(pc.cast((relevant if source == "qrels" else asked)["doc_id"], pa.string())))
    out.write_table("needed", pa.table({"doc_id": needed}))
    kind = "consensus" if cfg.kind == "consensus" else source
    if cfg.small_pool and YARDSTICKS[kind].pooled:
        log.warning("%s: each is judged by so few others that one model unlike the rest sets their consensus; the "
                    "%s' decision is weak (docs/select.md)", few, kind)
    out.extra.update(kind=kind, held_out=len(ids), share=fraction, queries=asking, needed=len(needed),
                     **({"source": source} if kind != source else {}))
    log.info("%s yardstick%s: %d documents held out of training (%.0f%% of %d), %d queries ask", kind,
             f" (by {source})" if kind != source else "", len(ids), 100 * fraction, docs.num_rows, asking)


def drawn(queries: pa.Table, cfg: YardstickConfig) -> pa.Table:
    """`queries` with only `max_queries` of those that ask still asking (`not_drawn`: the others), the ones first by
    a hash of (seed, query id): the same queries whatever order the corpus or file lists them in."""
    asking = [q for q, s in zip(queries["query_id"].to_pylist(), queries["status"].to_pylist()) if s == "ok"]
    kept = sorted(asking, key=lambda q: stable_hash(cfg.seed, q))[: cfg.max_queries]
    status = pc.if_else(pc.and_(pc.equal(queries["status"], "ok"), pc.invert(pc.is_in(queries["query_id"],
                                                                                        pa.array(kept)))),
                        NOT_DRAWN, queries["status"])
    return queries.set_column(queries.schema.get_field_index("status"), "status", status)


def qrels_digest(cfg: YardstickConfig) -> str | None:
    """The user's queries file by its bytes: editing it in place builds the yardstick again."""
    return file_digest(cfg.qrels) if cfg.qrels else None


YARDSTICK = Stage("yardstick", build_yardstick, extra_key=qrels_digest)
