"""The yardsticks `embforge select` can rank candidates by, in one registry: what each needs, what its queries ask,
its known bias and its measured agreement with labels (benchmarks/yardsticks.py; docs/select.md's table).

Every kind holds a share of the corpus out of training (tasks/yardstick.py builds its queries; the evaluate stage
scores one model on them; the pooled kinds, `consensus`, `neighbours` and `clusters`, are scored across the
candidates by the select stage, tasks/metrics/pool.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Yardstick:
    needs: str  # what the corpus or config must have
    asks: str  # what each query asks, for the reader of a decision
    bias: str  # what a reader must know of a decision made on it
    prefix: str  # its metric rows' prefix: `<prefix>ndcg_at_10` is the score select ranks by
    queried: bool  # its queries are texts, embedded as queries (the others ask by a held-out document's vector)
    pooled: bool = False  # scored only across a pool of models, each judged by the others (no score of one model)
    maxsim: bool = False  # a multi-vector model is ranked on it by MaxSim (its queries' token vectors: texts', or a
    #                       held-out document's own)
    agreement: str | None = None  # its Kendall tau against labels as measured (benchmarks/yardsticks.py), or None
    every_document: bool = False  # every document of the corpus asks (none drawn), not only the held-out ones
    score: str = "ndcg_at_10"  # what each query scores
    called: str = "the yardstick"  # what a decision calls it in a sentence

    @property
    def metric(self) -> str:
        return f"{self.prefix}{self.score}"

    @property
    def units(self) -> str:
        """What its paired intervals are over: its queries, or the documents that ask by their own vectors."""
        return "queries" if self.queried else "documents"


CLUSTERS, SEEDS, NEAREST = 20, 4, 10  # the clusters kind's groups, k-means seeds averaged, neighbours asked
# The fewest models a pooled kind judges by each other (the untrained one and the candidates): fewer, and one model
# unlike the rest sets the others' consensus (benchmarks/pool_size.py; docs/select.md)
MIN_POOL = 4
# Where the agreements below come from: five small corpora (docs/select.md#the-yardsticks-against-labels)
MEASURED = ("against the labels (kNN accuracy; on SciFact its test claims' nDCG@10), median of the demo's OHSUMED, "
            "arXiv, medical abstracts, 20 Newsgroups and SciFact (400 documents, SciFact 659; 13 candidates each; "
            "benchmarks/yardsticks.py, 2026-11-29)")
YARDSTICKS = {
    "qrels": Yardstick(
        needs="your queries and their relevant documents (`qrels`)",
        asks="each of your queries whose relevant documents are all held out finding them among the corpus",
        bias="it rewards what your queries ask, and no more: with few of them its intervals are wide, and only the "
             "queries whose every relevant document fell in the held-out share ask (a larger `held_out` asks more, and "
             "trains on fewer documents)",
        prefix="qrels_", queried=True, maxsim=True),
    "labels": Yardstick(
        needs="a label column",
        asks="each labelled held-out document finding the documents of its label among those not held out (your "
             "labels: no training used them)",
        bias="it rewards models that put documents of one label near each other; if what you will use the model for is "
             "not that grouping (finding answers to questions, say), a recipe it ranks lower may suit you better",
        prefix="label_", queried=False, maxsim=True, agreement="they are the truth the others are measured against"),
    "titles": Yardstick(
        needs="a title column",
        asks="each held-out document's title finding its own text among the corpus",
        bias="a title names its document's topic in a few words, so the yardstick favours models that match short "
             "texts to long ones by topic (the query-trained recipes, SemCSE with titles as positives)",
        called="the titles", prefix="title_", queried=True, maxsim=True,
        agreement=f"Kendall tau +0.41 (p < 0.05 on 4 of 5) {MEASURED}"),
    "queries": Yardstick(
        needs="nothing but the text: an LLM (the queries stage's, offline by default) writes the queries",
        asks="each query an LLM wrote for a held-out document finding that document among the corpus",
        bias="the queries are a small LLM's: short, often lifted from the document's own words, so it favours models "
             "that match a document's salient terms; and GPL/InPars candidates train on queries from the same LLM "
             "(for other documents)",
        called="an LLM's queries", prefix="generated_", queried=True, maxsim=True,
        agreement=f"Kendall tau +0.48 (p < 0.05 on 3 of 5, at chance on two) {MEASURED}"),
    "consensus": Yardstick(
        needs="titles, or the LLM's queries where the corpus has none",
        asks="each held-out query (a title, or an LLM's) ranking the corpus as the other candidates' rankings, fused, "
             "say it should (its own document counting most); each candidate is judged by the fusion of the others",
        bias="pool-relative: it rewards agreeing with the other candidates, so a candidate better in a way none of the "
             "others are is marked down; it needs a pool (every rung's candidates and the untrained model)",
        prefix="consensus_", queried=True, pooled=True,
        agreement=f"Kendall tau +0.40 over titles (p < 0.05 on 3 of 5, two more at 0.050-0.053), +0.38 over the "
                  f"LLM's queries (p < 0.05 on 3 of 5), {MEASURED}"),
    "neighbours": Yardstick(
        needs="nothing but the text",
        asks="each held-out document, by its own vector, ranking the corpus's other documents as the other "
             "candidates' rankings, fused, say it should; each candidate is judged by the fusion of the others",
        bias="pool-relative: it rewards putting near a document what the other candidates put near it, so a candidate "
             "better in a way none of the others are is marked down, and its interval against the untrained model "
             "measures agreement, not a gain (from a decoder base, with two candidates, it found level a model the "
             "labels put +0.099 ahead; with `confirm`, an LLM's queries put it +0.073 ahead and it was exported); it "
             "measures how a model groups documents, not how it matches a short query to them; it needs a pool "
             "(every rung's candidates and the untrained model)",
        prefix="neighbours_", queried=False, pooled=True,
        agreement=f"Kendall tau +0.53 (p < 0.05 on 3 of 5, 0.052 and 0.064 on the other two), the highest median of "
                  f"the label-free kinds, {MEASURED}"),
    "clusters": Yardstick(
        needs="nothing but the text",
        asks="each document of the corpus, by its own vector, having its 10 nearest others in its group of the other "
             "candidates' grouping (k-means, 20 groups, over their vectors side by side; the share averaged over four "
             "seeds); each candidate is judged by the grouping of the others",
        bias="pool-relative, as the neighbours: a candidate that groups the corpus in a way none of the others do is "
             "marked down, and its interval against the untrained model measures agreement, not a gain; it measures "
             "how a model groups documents by topic (what kNN accuracy asks of labels), not how it matches a short "
             "query to them; every document asks, those trained on too; it needs a pool (every rung's candidates and "
             "the untrained model); against the untrained model the pool is one side, the trained candidates, which "
             "move together: on 20 Newsgroups' posts (stripped of who wrote them) it put dropout at 2e-5 ahead of the "
             "untrained model by +0.043 [+0.035, +0.050], which kNN accuracy put level (-0.007 [-0.025, +0.011]), "
             "the untrained model's score falling from 0.641 to 0.576 as the others trained (so, with `confirm`, "
             "a kind that judges each model by itself sets the winner against the untrained model)",
        prefix="clusters_", queried=False, pooled=True, every_document=True, score="purity_at_10",
        agreement="Kendall tau +0.74 (p 0.0001), +0.76 (p 0.0001), +0.62 (p 0.001) and -0.33 (p 0.95) against kNN "
                  "accuracy at 2,000 documents of the demo's OHSUMED, arXiv 2007, medical abstracts and 20 Newsgroups, "
                  "and +0.77 (p 0.0001) against SciFact's test claims' nDCG@10, 13 candidates each as select makes "
                  "them (median +0.74, p < 0.05 on four of five; titles: median +0.36): the highest of the label-free "
                  "kinds on the first three (titles +0.36, +0.12, +0.36), and on 20 Newsgroups, where the labels "
                  "favour TSDAE and every label-free kind ranks it low, below chance as all of them (titles -0.51; "
                  "+0.41, p 0.031, against kNN on those posts without their attribution lines, which misled the "
                  "contrastive models); median +0.50 at 400 documents of four corpora (benchmarks/yardsticks.py, "
                  "2026-12-02 to 2026-12-07)"),
}
KINDS = tuple(YARDSTICKS)
TEXT_QUERIES = ("titles", "queries")  # where a consensus's queries come from, in this order
CARRIED_SHARE = 0.5  # the share of a corpus's documents with a title (a label) from which `auto` asks by them


def carried(count: int, documents: int) -> bool:
    """Whether a corpus's titles (or labels), on `count` of its documents, can stand for it: where fewer than half its
    documents have one, those are a part of the corpus that they chose (and few ask), so `auto` takes the corpus as
    text alone (where a kind of one model must decide, an LLM writes queries rather than trust a few labels)."""
    return count > 0 and count >= CARRIED_SHARE * documents


def yardstick_kind(manifest: dict) -> str:
    """The kind a yardstick artifact is (`auto` resolved), from its manifest."""
    return manifest["extra"]["kind"]


def yardstick_pooled(manifest: dict) -> bool:
    """Whether its kind is scored only across a pool of models (consensus, neighbours, clusters), from its manifest."""
    return YARDSTICKS[yardstick_kind(manifest)].pooled


def ranks_per_token(kind: str, source: str) -> bool:
    """Whether a model of a vector per token (multi-vector) is ranked on a yardstick of this kind and source: by
    MaxSim, where its queries are texts (titles, an LLM's, yours) or labelled documents, and no pool fuses the
    candidates' one vector a text."""
    return not YARDSTICKS[kind].pooled and YARDSTICKS[source].maxsim


def yardstick_source(manifest: dict) -> str:
    """What its queries are (a consensus's: titles or the LLM's queries; every other kind's: the kind itself)."""
    return manifest["extra"].get("source", yardstick_kind(manifest))
