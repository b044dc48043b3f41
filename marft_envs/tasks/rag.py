"""Retrieval-augmented question answering for teams (MMOA-RAG style), offline or on real data.

``rag-solo-v0``, ``rag-quartet-v0``

| Property     | Value |
|--------------|-------|
| Task         | :class:`RAGTask`: answer a (multi-hop) question from a document collection |
| Agents       | solo: ``generator``; quartet: ``rewriter`` -> ``selector`` -> ``filter`` -> ``generator`` |
| Tools        | ``search`` (the selector in the quartet, the generator in solo; budget 2) |
| Reward       | shared team reward = :func:`answer_reward` (1 for an exact match, else at most half the answer F1, divided among listed answers), minus cost terms; EM is ``correct`` |
| Data         | ``dataset="kb"`` (procedural, offline, default), ``"hotpotqa"``, ``"nq"`` |

**The quartet** (Chen et al., 2025, MMOA-RAG): the *rewriter* turns the
question into search queries (one per line); the env retrieves the top
documents for them and shows them, numbered ``[D7]``, to the *selector*, which
names the useful ones (it may also call ``search``); the *filter* sees only the
documents the selector named and keeps the relevant ones; the *generator* sees
only the documents the filter kept and answers. Who sees which documents is
``doc_view`` (role -> ``"none"`` | ``"retrieve"`` | ``"named"``): ``retrieve``
shows the top ``k`` documents for the queries in the latest teammate's reply
(or for the question when no teammate acted), ``named`` shows the documents
whose ids the latest teammate named that named any, keeping only documents that
teammate was shown in this episode (by its own view or its own ``search``
calls): naming an id never reveals a document no retrieval surfaced (an agent
with no teammates before it retrieves for the question). Roles not in
``doc_view`` retrieve. The ids each agent's ``search`` calls returned are episode
state of the task (copied with the env, cleared by :meth:`RAGTask.start_tool_episode`),
so one ``RAGTask`` instance serves one env.

**Grading.** The answer is the text after the last ``Answer:`` (else the last
``\\boxed{}``, else the last non-empty line), compared with every gold alias
after SQuAD normalisation (lower case, no punctuation or articles): ``correct``
is exact match (EM), ``score`` is :func:`answer_reward`: 1 for an exact match,
otherwise ``PARTIAL_CREDIT`` (1/2) times the best token F1 of one listed answer
divided by how many answers are listed (``"A, B or C"`` is three answers; a
separator that occurs in the gold answer itself does not split). So committing to
the right answer (1) beats every list that contains it (at most 1/4), and listing
all ``n`` candidates (at most ``1/(2n)``) never beats naming one of them at random
(at least ``1/n`` when the gold is among them). ``details`` report ``em``, ``f1``
(the plain SQuAD F1, for comparison with the literature), ``answers`` (how many were
listed), ``queries`` (lines the rewriter wrote), ``docs_shown`` (documents the
answering agent saw), ``support_recall`` (share of the supporting documents among
them, when known) and ``unseen_doc_ids`` (document ids a teammate named that it was
never shown: ignored, and flagged ``unseen_doc_ids``).

**Retrieval.** :class:`BM25Retriever` (``bm25s``) indexes the corpus once per
task (per problem for HotpotQA's ten paragraphs or DPR-style contexts).
``bm25s`` was chosen over ``rank-bm25``: it is maintained (rank-bm25's last
release is from 2022), Apache-2.0, needs only ``numpy`` at run time, works
offline (stop words ship with it) and scores with sparse matrices, fast on the
corpus sizes of real RAG sets. Any object with ``index(docs)`` and
``search(query, k) -> [(doc_index, score)]`` (the :class:`Retriever`
protocol) can replace it: ``retriever="module:Class"``, e.g. a dense retriever.

**Data.** ``kb``: :mod:`marft_envs.tasks.kb` (knobs ``hops``, ``n_people``,
``distractors``, ``seed``). ``hotpotqa`` (distractor setting; splits ``train``,
``validation``): ``data_dir`` / ``$MARFT_DATA_DIR`` with
``hotpotqa/<split>.jsonl`` (the Hub's or the original field layout), else the
Hub ``hotpotqa/hotpot_qa`` (config ``distractor``). ``nq`` (Natural Questions
open; splits ``train``, ``validation``): ``nq/<split>.jsonl`` rows with
``question``, ``answer`` (a list of aliases) and optionally DPR-style ``ctxs``
(``[{"title", "text"}]``), plus an optional ``nq/corpus.jsonl``
(``{"title", "text"}`` per line) shared by all questions; else the Hub
``google-research-datasets/nq_open`` (questions only: give a corpus or
``closed_book=True``).

Arguments: ``dataset``, ``split``, ``data_dir``, ``k`` (5), ``max_queries``
(3), ``doc_view``, ``max_doc_chars`` (600), ``retriever`` (``"bm25"``),
``closed_book`` (False), ``limit`` (first N problems), and the ``kb`` knobs.

Version history: v0: initial release.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import string
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from marft_envs import data
from marft_envs.data import resolve_data_dir
from marft_envs.tasks.base import GradeResult, Problem, Task, demo_seat
from marft_envs.tasks.kb import KnowledgeBase

__all__ = [
    "BM25Retriever",
    "DOC_VIEWS",
    "Document",
    "RAGTask",
    "Retriever",
    "answer_em",
    "answer_f1",
    "answer_reward",
    "split_answers",
    "extract_answer",
    "load_hotpotqa",
    "load_nq",
    "normalize_answer",
    "PARTIAL_CREDIT",
]

#: Default document view per role (see the module docstring).
DOC_VIEWS: dict[str, str] = {"rewriter": "none", "selector": "retrieve", "filter": "named", "generator": "named"}
_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the to was were which who what where "
    "when how did does do this with".split()
)
_TOKEN_RE = re.compile(r"\w+")
_DOC_ID_RE = re.compile(r"\bD(\d{1,6})\b")
_ANSWER_RE = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]{0,300})\}")
_TAIL = 20_000
#: Share of the token F1 a non-exact answer earns (<= 1/2: see :func:`answer_reward`).
PARTIAL_CREDIT = 0.5
# What separates the answers of a hedged list ("A, B or C"); a comma between digits does not.
_SEPARATORS = {",": r",(?!\d)", ";": ";", "/": "/", "|": r"\|", "&": "&", "\n": "\n",
               " and ": r"\band\b", " or ": r"\bor\b"}


@dataclass(frozen=True)
class Document:
    """One passage: ``id`` as shown to agents (``"D7"``), ``title`` and ``text``."""

    id: str
    title: str
    text: str


@runtime_checkable
class Retriever(Protocol):
    """What :class:`RAGTask` needs from a retriever (BM25 by default; dense ones plug in)."""

    def index(self, docs: Sequence[Document]) -> None:
        """Build the index over ``docs`` (called once per corpus)."""

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` ``(index into docs, score)`` pairs, best first; only matches."""


def _tokens(text: str) -> list[str]:
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


class BM25Retriever:
    """Okapi BM25 over title + text with ``bm25s`` (``k1``, ``b`` as in bm25s' defaults)."""

    def __init__(self, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = float(k1), float(b)
        self._bm25: Any = None
        self._n = 0

    def index(self, docs: Sequence[Document]) -> None:
        """Index ``docs`` (an empty corpus gives an index that finds nothing)."""
        # deferred: bm25s is an optional dependency
        import bm25s

        self._n = len(docs)
        if not docs:
            self._bm25 = None
            return
        corpus = [_tokens(f"{d.title} {d.text}") or ["\u2205"] for d in docs]
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        self._bm25.index(corpus, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top ``k`` documents with a positive score; ties keep corpus order."""
        q = _tokens(query)[:64]
        if self._bm25 is None or not q or k < 1:
            return []
        ids, scores = self._bm25.retrieve([q], k=min(int(k), self._n), show_progress=False, n_threads=1)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]
        return sorted(hits, key=lambda h: (-round(h[1], 9), h[0]))


# ------------------------------------------------------------------------------ grading
def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(c for c in text if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_em(prediction: str, golds: Sequence[str]) -> bool:
    """Exact match after normalisation with any gold alias."""
    p = normalize_answer(prediction)
    return any(p == normalize_answer(g) for g in golds)


def answer_f1(prediction: str, golds: Sequence[str]) -> float:
    """Best token F1 over the gold aliases (SQuAD definition)."""
    p = normalize_answer(prediction).split()
    best = 0.0
    for g in golds:
        t = normalize_answer(g).split()
        common = Counter(p) & Counter(t)
        same = sum(common.values())
        if not p or not t:
            best = max(best, float(p == t))
        elif same:
            precision, recall = same / len(p), same / len(t)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def split_answers(prediction: str, gold: str) -> list[str]:
    """The answers a prediction lists (``"A, B or C"`` -> three), split on list separators
    that do not occur in ``gold`` itself (``"AC/DC"`` keeps ``/``); empty parts dropped."""
    low = f" {gold.lower()} "
    seps = [rx for sep, rx in _SEPARATORS.items() if sep not in low]
    parts = re.split("|".join(seps), prediction, flags=re.IGNORECASE) if seps else [prediction]
    return [p for p in parts if normalize_answer(p)] or [prediction]


def answer_reward(prediction: str, golds: Sequence[str]) -> float:
    """1 for an exact match; else ``PARTIAL_CREDIT * F1(best listed answer) / answers listed``.

    Why: plain F1 pays hedging (the gold plus a wrong entity scores 0.67, a wrong single
    guess 0; listing every candidate of the documents beat naming one at random). Here a
    list of the gold and ``k >= 1`` others earns at most ``PARTIAL_CREDIT / (k + 1) < 1``;
    listing ``n`` candidates earns at most ``PARTIAL_CREDIT / n`` times the best one's F1,
    never more than naming one of them at random earns in expectation. Unsplittable lists
    ("A B C") are priced by F1 itself: with ``PARTIAL_CREDIT <= 1/2`` the gold among ``n``
    same-length names scores ``2 / (2 (n + 1)) < 1 / n``.
    """
    if answer_em(prediction, golds):
        return 1.0
    best = 0.0
    for g in golds:
        parts = split_answers(prediction, g)
        best = max(best, max(answer_f1(p, [g]) for p in parts) / len(parts))
    return PARTIAL_CREDIT * best


def extract_answer(response: str) -> tuple[str | None, bool]:
    """``(answer, format_ok)``: the last ``Answer:``, else ``\\boxed{}``, else the last line."""
    tail = response[-_TAIL:]
    found = _ANSWER_RE.findall(tail)
    if found:
        return found[-1].strip().strip("*").strip()[:300], True
    boxed = _BOXED_RE.findall(tail)
    if boxed:
        return boxed[-1].strip(), True
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    return (lines[-1][:300] if lines else None), False


# ------------------------------------------------------------------------------ data
def _local_rows(name: str, split: str, data_dir: str | os.PathLike[str] | None) -> tuple[list[dict[str, Any]] | None, Path | None]:
    root = resolve_data_dir(data_dir)
    if root is None:
        return None, None
    path = root / name / f"{split}.jsonl"
    if not path.is_file():
        return None, root
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
    return rows, root


def _hub_rows(hub_id: str, config: str | None, split: str, name: str, root: Path | None) -> list[dict[str, Any]]:
    where = f"no file {root / name / (split + '.jsonl')}" if root else "no local data directory"
    advice = (f"cannot load {name}/{split}: {where}, and the Hugging Face Hub failed ({{}}).\nFix it either way:\n"
              f"  1. local files: data_dir=<dir> or ${data.DATA_DIR_ENV}=<dir> with <dir>/{name}/{split}.jsonl "
              f"(layout: marft_envs/tasks/rag.py);\n  2. the Hub: internet access to {hub_id!r}.")
    # The same fast offline checks as marft_envs.data (private helpers there; these loaders
    # should move into marft_envs/data.py).
    if data._hub_offline() or not data._hub_reachable():
        raise data.DataNotFoundError(advice.format("offline or unreachable"))
    try:
        # deferred: datasets is heavy: it loads only when data is fetched
        from datasets import load_dataset

        ds = load_dataset(hub_id, config, split=split) if config else load_dataset(hub_id, split=split)
    except Exception as e:  # noqa: BLE001 - any Hub failure gets the same advice
        raise data.DataNotFoundError(advice.format(f"{type(e).__name__}: {e}")) from e
    return [dict(r) for r in ds]


def _hotpot_context(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    ctx = row.get("context")
    if isinstance(ctx, Mapping):  # Hub layout: {"title": [...], "sentences": [[...], ...]}
        return [(t, "".join(s)) for t, s in zip(ctx.get("title", []), ctx.get("sentences", []), strict=False)]
    return [(str(t), "".join(s)) for t, s in (ctx or [])]  # original: [[title, [sentences]], ...]


def _hotpot_support(row: Mapping[str, Any]) -> set[str]:
    sf = row.get("supporting_facts")
    if isinstance(sf, Mapping):
        return set(sf.get("title", []))
    return {str(t) for t, _ in (sf or [])}


def load_hotpotqa(split: str = "validation", data_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """HotpotQA (distractor) rows as ``{"id", "question", "answers", "docs", "support"}``."""
    if split not in ("train", "validation"):
        raise ValueError(f"HotpotQA split must be 'train' or 'validation', not {split!r}")
    rows, root = _local_rows("hotpotqa", split, data_dir)
    if rows is None:
        rows = _hub_rows("hotpotqa/hotpot_qa", "distractor", split, "hotpotqa", root)
    out = []
    for i, r in enumerate(rows):
        docs = _hotpot_context(r)
        support = _hotpot_support(r)
        out.append({
            "id": str(r.get("id", r.get("_id", i))),
            "question": str(r["question"]),
            "answers": [str(r["answer"])],
            "docs": [{"title": t, "text": x} for t, x in docs],
            "support": [j for j, (t, _) in enumerate(docs) if t in support],
        })
    return out


def load_nq(split: str = "validation", data_dir: str | os.PathLike[str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, str]] | None]:
    """NQ-open rows ``{"id", "question", "answers", "docs"?}`` and the shared corpus (or None)."""
    if split not in ("train", "validation"):
        raise ValueError(f"NQ split must be 'train' or 'validation', not {split!r}")
    rows, root = _local_rows("nq", split, data_dir)
    if rows is None:
        rows = _hub_rows("google-research-datasets/nq_open", None, split, "nq", root)
    corpus = None
    if root is not None and (root / "nq" / "corpus.jsonl").is_file():
        corpus, _ = _local_rows("nq", "corpus", root)
    out = []
    for i, r in enumerate(rows):
        answers = r.get("answer", r.get("answers"))
        answers = [answers] if isinstance(answers, str) else [str(a) for a in answers or []]
        row: dict[str, Any] = {"id": str(r.get("id", i)), "question": str(r["question"]), "answers": answers}
        if r.get("ctxs"):
            row["docs"] = [{"title": str(c.get("title", "")), "text": str(c.get("text", ""))} for c in r["ctxs"]]
        out.append(row)
    return out, [{"title": str(d.get("title", "")), "text": str(d.get("text", ""))} for d in corpus] if corpus else None


# ------------------------------------------------------------------------------ task
def _make_retriever(spec: Any) -> Retriever:
    if spec == "bm25":
        return BM25Retriever()
    if isinstance(spec, str) and ":" in spec:
        module, attr = spec.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)
        return obj()
    if callable(spec):
        return spec()
    raise ValueError(f"retriever must be 'bm25', 'module:Class' or a factory, got {spec!r}")


class RAGTask(Task):
    """Question answering over documents (see the module docstring)."""

    name = "rag"
    instructions = "Answer with a short phrase (a name, not a sentence), on a last line of the form: Answer: <answer>"

    def __init__(
        self,
        dataset: str = "kb",
        split: str = "train",
        data_dir: str | os.PathLike[str] | None = None,
        *,
        k: int = 5,
        max_queries: int = 3,
        doc_view: Mapping[str, str] | None = None,
        max_doc_chars: int = 600,
        retriever: Any = "bm25",
        closed_book: bool = False,
        limit: int | None = None,
        hops: Sequence[int] = (1, 2, 3),
        n_people: int = 40,
        distractors: int = 1,
        seed: int = 0,
    ) -> None:
        if dataset not in ("kb", "hotpotqa", "nq"):
            raise ValueError(f"unknown RAG dataset {dataset!r}; choose 'kb', 'hotpotqa' or 'nq'")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        views = {**DOC_VIEWS, **dict(doc_view or {})}
        bad = {r: v for r, v in views.items() if v not in ("none", "retrieve", "named")}
        if bad:
            raise ValueError(f"doc_view values must be 'none', 'retrieve' or 'named', got {bad}")
        self.dataset, self.split, self.k, self.max_queries = dataset, split, int(k), int(max_queries)
        self.doc_view, self.max_doc_chars, self.closed_book = views, int(max_doc_chars), bool(closed_book)
        self.retriever_spec = retriever
        self._corpus: list[Document] = []
        self._problems: list[Problem] = []
        if dataset == "kb":
            if split not in ("train", "test"):
                raise ValueError(f"kb split must be 'train' or 'test', not {split!r}")
            kb = KnowledgeBase.generate(seed=seed, split=split, n_people=n_people, distractors=distractors, hops=tuple(hops))
            self._corpus = [Document(f"D{i}", t, x) for i, (t, x) in enumerate(kb.docs)]
            for i, q in enumerate(kb.questions):
                self._problems.append(Problem(
                    id=f"rag/kb-s{seed}-n{n_people}-d{distractors}/{split}/{i}", question=q.question, answer=q.answer,
                    meta={"answers": [q.answer], "hops": q.hops, "path": list(q.path),
                          "support": [f"D{j}" for j in q.supporting], "expected_tools": ["search"]}))
        elif dataset == "hotpotqa":
            for r in load_hotpotqa(split, data_dir):
                self._problems.append(Problem(
                    id=f"rag/hotpotqa/{split}/{r['id']}", question=r["question"], answer=r["answers"][0],
                    meta={"answers": r["answers"], "docs": r["docs"], "support": [f"D{j}" for j in r["support"]],
                          "expected_tools": ["search"]}))
        else:
            rows, corpus = load_nq(split, data_dir)
            if corpus:
                self._corpus = [Document(f"D{i}", d["title"], d["text"]) for i, d in enumerate(corpus)]
            if not closed_book and not corpus and not all("docs" in r for r in rows[:1]):
                raise ValueError(
                    "nq has no documents here: give data_dir with nq/corpus.jsonl or DPR-style 'ctxs' in "
                    "nq/<split>.jsonl, or closed_book=True to answer without retrieval"
                )
            for r in rows:
                meta: dict[str, Any] = {"answers": r["answers"], "expected_tools": ["search"]}
                if "docs" in r:
                    meta["docs"] = r["docs"]
                self._problems.append(Problem(id=f"rag/nq/{split}/{r['id']}", question=r["question"],
                                              answer=r["answers"][0] if r["answers"] else "", meta=meta))
        if limit is not None:
            self._problems = self._problems[: int(limit)]
        if not self._problems:
            raise ValueError(f"RAG dataset {dataset!r} split {split!r} has no problems with these settings")
        self._indexes: OrderedDict[str, tuple[list[Document], Retriever]] = OrderedDict()
        # Ids each agent's `search` calls returned in the current episode (see start_tool_episode).
        self._revealed: dict[str, set[str]] = {}
        self._revealed_for: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_indexes"] = OrderedDict()  # indexes are rebuilt on demand, never pickled
        state["_revealed"] = {a: set(ids) for a, ids in self._revealed.items()}  # episode state: a copy
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> RAGTask:
        # Problems and corpus are read-only: share them; only the index cache is per copy.
        new = object.__new__(RAGTask)
        new.__dict__.update(self.__getstate__())
        return new

    def __len__(self) -> int:
        return len(self._problems)

    def get(self, index: int) -> Problem:
        """Problem ``index`` (deterministic)."""
        index = int(index)
        if not 0 <= index < len(self._problems):
            raise IndexError(f"problem index {index} out of range [0, {len(self._problems)})")
        return self._problems[index]

    # -------------------------------------------------------------- retrieval
    def documents(self, problem: Problem | None) -> list[Document]:
        """The collection ``problem`` is answered from (its own documents, else the task's corpus)."""
        if self.closed_book:
            return []
        docs = (problem.meta.get("docs") if problem is not None else None) or None
        if docs:
            return [Document(f"D{i}", d["title"], d["text"]) for i, d in enumerate(docs)]
        return self._corpus

    def _index(self, problem: Problem | None) -> tuple[list[Document], Retriever]:
        own = problem is not None and bool(problem.meta.get("docs"))
        key = problem.id if own else "<corpus>"
        if key in self._indexes:
            self._indexes.move_to_end(key)
            return self._indexes[key]
        docs = self.documents(problem)
        retriever = _make_retriever(self.retriever_spec)
        retriever.index(docs)
        self._indexes[key] = (docs, retriever)
        while len(self._indexes) > 64:
            self._indexes.popitem(last=False)
        return docs, retriever

    def search_documents(self, query: str, k: int, problem: Problem | None, agent: str | None = None) -> list[Document]:
        """The top ``k`` documents for ``query`` (the ``search`` tool calls this).

        With ``agent`` (the ``search`` tool passes the caller), the ids found are recorded as
        shown to that agent in this episode: it may then name them to its teammates."""
        docs, retriever = self._index(problem)
        found = [docs[i] for i, _ in retriever.search(str(query)[:2000], int(k)) if 0 <= i < len(docs)]
        if agent is not None and problem is not None:
            if self._revealed_for != problem.id:
                self._revealed, self._revealed_for = {}, problem.id
            self._revealed.setdefault(str(agent), set()).update(d.id for d in found)
        return found

    def start_tool_episode(self) -> None:
        """Forget the documents earlier episodes' ``search`` calls showed (the env's tool loop
        calls this at the first step of each episode)."""
        self._revealed, self._revealed_for = {}, None

    def _retrieve(self, queries: list[str], problem: Problem) -> list[Document]:
        ranked = [self.search_documents(q, self.k, problem) for q in queries]
        seen: dict[str, Document] = {}
        for rank in range(self.k):  # round-robin over the queries' rankings
            for hits in ranked:
                if rank < len(hits) and len(seen) < self.k:
                    seen.setdefault(hits[rank].id, hits[rank])
        return list(seen.values())

    def _queries(self, text: str, problem: Problem) -> list[str]:
        lines = []
        for line in text.splitlines():
            line = re.sub(r"^\s*(?:[-*\d.)]+\s*)?(?:query\s*\d*\s*:)?\s*", "", line, flags=re.IGNORECASE).strip()
            if _tokens(line):
                lines.append(line[:300])
        return lines[: self.max_queries] or [problem.question]

    def docs_for(self, agent: str, executed: list[tuple[str, str]], problem: Problem, parents: list[str]) -> list[Document] | None:
        """The documents ``agent`` sees now (``None``: its view shows none).

        A ``named`` view shows the documents named by the latest teammate that named any
        document it was shown in this episode (in its own view, or by its ``search`` calls);
        other ids are ignored (:meth:`unseen_ids`): naming a corpus id never reveals a document."""
        mode = self.doc_view.get(agent, "retrieve")
        if mode == "none" or self.closed_book:
            return None
        acted = [(a, x) for a, x in executed if a in parents]
        if not acted:
            return self._retrieve([problem.question], problem)
        if mode == "retrieve":
            return self._retrieve(self._queries(acted[-1][1], problem), problem)
        by_id = {d.id: d for d in self.documents(problem)}
        for j in range(len(executed) - 1, -1, -1):
            namer, text = executed[j]
            if namer not in parents:
                continue
            named = dict.fromkeys(f"D{m}" for m in _DOC_ID_RE.findall(text[-_TAIL:]))
            shown = self._shown_ids(namer, executed[:j], problem) if named else set()
            picked = [by_id[i] for i in named if i in shown and i in by_id]
            if picked:
                return picked[: 2 * self.k]
        return []

    def _shown_ids(self, agent: str, before: list[tuple[str, str]], problem: Problem) -> set[str]:
        """Ids ``agent`` was shown when it acted after ``before``: its view and its searches."""
        view = self.docs_for(agent, before, problem, [a for a, _ in before]) or []
        searched = self._revealed.get(agent, set()) if self._revealed_for == problem.id else set()
        return {d.id for d in view} | searched

    def unseen_ids(self, executed: list[tuple[str, str]], problem: Problem) -> int:
        """How many document ids the agents of ``executed`` named that they were never shown."""
        total = 0
        for j, (agent, text) in enumerate(executed):
            named = set(f"D{m}" for m in _DOC_ID_RE.findall(text[-_TAIL:]))
            if named:
                total += len(named - self._shown_ids(agent, executed[:j], problem))
        return total

    def view_context(self, agent: str, executed: list[tuple[str, str]], problem: Problem, parents: list[str]) -> str | None:
        """The env hook: the documents section of ``agent``'s view."""
        docs = self.docs_for(agent, executed, problem, parents)
        if docs is None:
            return None
        if not docs:
            return "Documents: none were selected."
        shown = "\n".join(f"[{d.id}] {d.title}: {d.text[: self.max_doc_chars]}" for d in docs)
        return f"Documents:\n{shown}"

    # -------------------------------------------------------------- demonstrations
    def demo_action(self, env: Any, agent: str) -> str | None:
        """A scripted demonstration for ``agent`` of ``env`` (SFT warm starts, docs/sft.md).

        Uses what the agent sees plus the problem's supporting documents (the oracle part):
        an agent with the ``search`` tool whose view lacks a supporting document searches for
        its title once per turn; the rewriter writes the question as its query; a selector or
        filter names the supporting documents it sees (else every document it sees); the
        answering agent writes ``Answer: <gold>``."""
        problem = getattr(env, "problem", None)
        if problem is None:
            return None
        executed = list(env.executed)
        parents = env.team.topology.parents(agent, executed)
        view = self.docs_for(agent, executed, problem, list(parents))
        searched = self._revealed.get(agent, set()) if self._revealed_for == problem.id else set()
        seen = [d.id for d in view or []] + sorted(searched - {d.id for d in view or []})
        by_id = {d.id: d for d in self.documents(problem)}
        support = [i for i in problem.meta.get("support") or [] if i in by_id]
        missing = [i for i in support if i not in seen]
        seat = demo_seat(env, agent)
        if "search" in seat.tools and missing and not seat.calls:
            return env.tool_loop.parser.example("search", {"query": by_id[missing[0]].title})
        if seat.answers:
            return f"Answer: {problem.answer}"
        if view is None and not seat.tools:  # sees no documents: the rewriter
            return problem.question
        named = [i for i in support if i in seen] or seen
        return " ".join(named) if named else "none"

    # -------------------------------------------------------------- grading
    def grade(self, response: str, problem: Problem) -> GradeResult:
        """EM is ``correct``, :func:`answer_reward` is ``score`` (see the module docstring)."""
        answer, format_ok = extract_answer(response if isinstance(response, str) else "")
        golds = list(problem.meta.get("answers") or [problem.answer])
        if answer is None:
            return GradeResult(correct=False, score=0.0, details={"em": 0.0, "f1": 0.0, "flags": ["no_answer"]})
        em, f1 = answer_em(answer, golds), answer_f1(answer, golds)
        answers = min(len(split_answers(answer, g)) for g in golds) if golds else 1
        return GradeResult(correct=em, score=answer_reward(answer, golds), extracted=answer, format_ok=format_ok,
                           details={"em": float(em), "f1": round(f1, 6), "answers": answers})

    def grade_turn(self, executed: list[tuple[str, str]], answer_agent: str, problem: Problem) -> GradeResult:
        """:meth:`grade` plus retrieval details of the turn (queries, documents shown, recall)."""
        result = self.grade(dict(executed)[answer_agent], problem)
        idx = [a for a, _ in executed].index(answer_agent)
        before = executed[:idx]
        docs = self.docs_for(answer_agent, before, problem, [a for a, _ in before]) or []
        unseen = self.unseen_ids(before, problem)
        support = set(problem.meta.get("support") or [])
        rewriter = [x for a, x in executed if self.doc_view.get(a) == "none"]
        result.details.update({
            "queries": len(self._queries(rewriter[0], problem)) if rewriter else 0,
            "docs_shown": len(docs),
            "support_recall": round(len(support & {d.id for d in docs}) / len(support), 6) if support else None,
            "unseen_doc_ids": unseen,
        })
        if unseen:
            result.details.setdefault("flags", []).append("unseen_doc_ids")
        return result

    def __repr__(self) -> str:
        return f"RAGTask(dataset={self.dataset!r}, split={self.split!r}, n={len(self)})"
