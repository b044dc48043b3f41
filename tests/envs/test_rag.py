"""The RAG task family: KB generator, grading, retrieval, document views, loaders, envs."""

from __future__ import annotations

import json

import pytest

import marft_envs
from marft_envs.tasks.kb import TEMPLATES, KnowledgeBase
from marft_envs.tasks.rag import (
    BM25Retriever,
    Document,
    RAGTask,
    Retriever,
    answer_em,
    answer_f1,
    extract_answer,
    normalize_answer,
)


# ------------------------------------------------------------------------------ KB
def test_kb_is_deterministic_and_splits_are_disjoint():
    a, b = KnowledgeBase.generate(seed=1), KnowledgeBase.generate(seed=1)
    assert a.questions == b.questions and a.docs == b.docs
    assert KnowledgeBase.generate(seed=2).docs != a.docs
    test = KnowledgeBase.generate(seed=1, split="test")
    assert not set(test.entities) & set(a.entities)


def test_kb_questions_follow_their_paths():
    kb = KnowledgeBase.generate(seed=0, n_people=12, distractors=2)
    assert {q.hops for q in kb.questions} == {1, 2, 3}
    # people 12, companies 6, cities 6; templates start from people (5), companies (5), cities (1... 1 template)
    starts = {"born_in": 12, "works_for": 12, "founded_by": 6, "headquartered_in": 6, "located_in": 6}
    assert len(kb.questions) == sum(starts[path[0]] for path, _ in TEMPLATES)
    for q in kb.questions:
        node = q.start
        for rel, doc in zip(q.path, q.supporting, strict=True):
            title, text = kb.docs[doc]
            assert title == node
            node = kb.entities[node][rel]
            assert node in text  # the supporting document states the hop
        assert node == q.answer
    assert {q.hops for q in KnowledgeBase.generate(hops=(2,)).questions} == {2}
    with pytest.raises(ValueError, match="hops"):
        KnowledgeBase.generate(hops=(4,))


def test_kb_lookalikes_share_surnames():
    kb = KnowledgeBase.generate(seed=0, n_people=8, distractors=1)
    people = [n for n, e in kb.entities.items() if e["type"] == "person"]
    surnames = [p.split(" ", 1)[1] for p in people]
    assert len(people) == 16 and all(surnames.count(s) == 2 for s in surnames)


# ------------------------------------------------------------------------------ grading
@pytest.mark.parametrize(
    "pred, golds, em, f1",
    [("Tovaris", ["Tovaris"], True, 1.0), ("the Tovaris.", ["tovaris"], True, 1.0),
     ("Tovaris city", ["Tovaris"], False, 2 / 3), ("Mira Kalven", ["Kalven"], False, 2 / 3),
     ("Zorbex", ["Mira Kalven"], False, 0.0), ("Kalven", ["Mira", "Kalven"], True, 1.0), ("", ["x"], False, 0.0)],
)
def test_f1_and_em_closed_forms(pred, golds, em, f1):
    assert answer_em(pred, golds) is em
    assert answer_f1(pred, golds) == pytest.approx(f1)


def test_extract_answer_and_normalize():
    assert extract_answer("thinking...\nAnswer: Tovaris") == ("Tovaris", True)
    assert extract_answer("answer: a\nmore\nAnswer: **b**") == ("b", True)
    assert extract_answer("so \\boxed{Zed}") == ("Zed", True)
    assert extract_answer("Just\nTovaris ") == ("Tovaris", False)
    assert extract_answer("   ") == (None, False)
    assert normalize_answer("The  Zorbex, Labs!") == "zorbex labs"


# ------------------------------------------------------------------------------ retrieval
def test_bm25_ranks_matching_documents_first():
    docs = [Document("D0", "Apple", "a red fruit"), Document("D1", "Tovaris", "Tovaris is a city in Brel."),
            Document("D2", "Brel", "Brel is a country.")]
    r = BM25Retriever()
    r.index(docs)
    assert isinstance(r, Retriever)
    assert r.search("Tovaris city", 3)[0][0] == 1
    assert [i for i, _ in r.search("Brel", 3)] == [2, 1]  # the shorter document with the term first
    assert r.search("zzz unknown", 3) == [] and r.search("", 3) == []
    empty = BM25Retriever()
    empty.index([])
    assert empty.search("Brel", 3) == []


def test_kb_retrieval_finds_supporting_documents():
    task = RAGTask(n_people=40)
    hits = found = 0
    for i in range(100):
        p = task.get(i)
        if p.meta["hops"] != 1:
            continue
        docs = task.search_documents(p.question, 5, p)
        hits += 1
        found += p.meta["support"][0] in {d.id for d in docs}
    assert hits > 10 and found / hits >= 0.9  # one-hop questions name their entity


class _FirstDocs:
    """A stand-in 'dense' retriever: always the first k documents."""

    def index(self, docs):
        self.n = len(docs)

    def search(self, query, k):
        return [(i, 1.0) for i in range(min(k, self.n))]


def test_retriever_is_pluggable():
    task = RAGTask(retriever=_FirstDocs, k=2)
    p = task.get(0)
    assert [d.id for d in task.search_documents("anything", 2, p)] == ["D0", "D1"]
    with pytest.raises(ValueError, match="retriever must be"):
        RAGTask(retriever="nope")._index(None)


# ------------------------------------------------------------------------------ team views
def test_quartet_passes_documents_by_id():
    env = marft_envs.make("rag-quartet-v0")
    env.reset(options={"problem_index": 1})
    p = env.problem
    assert env.agent_selection == "rewriter" and "Documents" not in env.observe("rewriter")["prompt"]
    first, second = p.meta["support"]
    env.step("query: " + p.question)
    sel = env.observe("selector")["prompt"]
    assert "Documents:" in sel and f"[{first}]" in sel
    assert env.tools("selector")[0]["function"]["name"] == "search" and env.tools("filter") == []
    if f"[{second}]" not in sel:  # not retrieved for the selector: it must find it by search to name it
        title = env.task.documents(p)[int(second[1:])].title
        env.step('<tool_call>{"name": "search", "arguments": {"query": "' + title + '", "k": 3}}</tool_call>')
        assert f"[{second}]" in env.infos["selector"]["tool_messages"][0]["content"]
    env.step(f"Useful: {first}, {second}, D99999")  # an unknown id is ignored (and flagged at grading)
    filt = env.observe("filter")["prompt"].split("Documents:\n", 1)[1]
    assert [line.split("]")[0] + "]" for line in filt.splitlines()[:2]] == [f"[{first}]", f"[{second}]"]
    env.step(f"Keep {second}")
    gen = env.observe("generator")["prompt"]
    assert f"[{second}]" in gen and f"[{first}]" not in gen
    env.step(f"Answer: {p.answer}")
    info = env.infos["generator"]
    assert info["grade"]["correct"] and info["grade"]["details"]["f1"] == 1.0
    assert info["grade"]["details"]["docs_shown"] == 1 and info["grade"]["details"]["support_recall"] == 0.5
    assert info["grade"]["details"]["unseen_doc_ids"] == 1 and "unseen_doc_ids" in info["flags"]
    assert info["reward_components"]["partial"] == 1.0 and info["reward_components"]["outcome"] == 0.0
    comps = info["reward_components"]
    assert info["team_reward"] == pytest.approx(1.0 + comps["tokens"] + comps["tool_calls"])


def test_quartet_with_no_selection_shows_no_documents():
    env = marft_envs.make("rag-quartet-v0")
    env.reset(seed=0)
    env.step("q")
    env.step("nothing useful")
    assert "Documents: none were selected." in env.observe("filter")["prompt"]


def test_solo_search_tool_returns_documents():
    env = marft_envs.make("rag-solo-v0")
    env.reset(options={"problem_index": 0})
    assert "Documents:" in env.observe("generator")["prompt"]
    env.step('<tool_call>{"name": "search", "arguments": {"query": "' + env.problem.answer + '", "k": 2}}</tool_call>')
    msg = env.infos["generator"]["tool_messages"][0]
    assert env.agent_selection == "generator" and msg["content"].startswith("[D") and len(msg["content"].splitlines()) <= 2
    env.step('<tool_call>{"name": "search", "arguments": {"query": "x", "k": 99}}</tool_call>')
    assert "bad_tool_arguments" in env.infos["generator"]["flags"]
    env.step("Answer: nobody")  # budget 2 spent or not, a reply without a call ends the turn
    info = env.infos["generator"]
    assert info["tool_selection_accuracy"] == 1.0 and info["reward_components"]["tool_calls"] == pytest.approx(-0.02)
    assert info["reward_components"]["tool_errors"] == pytest.approx(-0.05)


def test_rag_task_pickles_without_its_index():
    import pickle

    task = RAGTask()
    task.search_documents("x", 1, task.get(0))
    assert task._indexes and not pickle.loads(pickle.dumps(task))._indexes


# ------------------------------------------------------------------------------ loaders
def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")


def test_hotpotqa_local_files_in_both_layouts(tmp_path):
    original = {"_id": "a1", "question": "Where was X born?", "answer": "Brel",
                "context": [["X", ["X was born in ", "Brel."]], ["Y", ["Y is a dog."]]],
                "supporting_facts": [["X", 0]]}
    hub = {"id": "b2", "question": "Q?", "answer": "yes",
           "context": {"title": ["T1", "T2"], "sentences": [["s1."], ["s2."]]},
           "supporting_facts": {"title": ["T2"], "sent_id": [0]}}
    _write(tmp_path / "hotpotqa" / "validation.jsonl", [original, hub])
    task = RAGTask("hotpotqa", "validation", data_dir=tmp_path)
    p0, p1 = task.get(0), task.get(1)
    assert p0.id == "rag/hotpotqa/validation/a1" and p0.meta["support"] == ["D0"]
    assert [d.text for d in task.documents(p0)] == ["X was born in Brel.", "Y is a dog."]
    assert p1.meta["support"] == ["D1"] and task.search_documents("born", 1, p0)[0].title == "X"
    assert task.grade("Answer: Brel", p0).correct


def test_nq_local_files(tmp_path):
    _write(tmp_path / "nq" / "validation.jsonl", [{"question": "who?", "answer": ["Ann", "Ann Lee"]}])
    with pytest.raises(ValueError, match="closed_book=True"):
        RAGTask("nq", "validation", data_dir=tmp_path)
    closed = RAGTask("nq", "validation", data_dir=tmp_path, closed_book=True)
    assert closed.grade("Answer: ann lee", closed.get(0)).correct and closed.documents(closed.get(0)) == []
    _write(tmp_path / "nq" / "corpus.jsonl", [{"title": "Ann Lee", "text": "Ann Lee wrote it."}])
    task = RAGTask("nq", "validation", data_dir=tmp_path)
    assert task.search_documents("who wrote it Ann", 1, task.get(0))[0].title == "Ann Lee"
    _write(tmp_path / "nq2" / "nq" / "train.jsonl", [{"question": "q", "answer": "A", "ctxs": [{"title": "t", "text": "A"}]}])
    ctx = RAGTask("nq", "train", data_dir=tmp_path / "nq2")
    assert ctx.get(0).meta["answers"] == ["A"] and ctx.documents(ctx.get(0))[0].text == "A"


def test_loader_errors_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hotpotqa/validation.jsonl"):
        RAGTask("hotpotqa", "validation", data_dir=tmp_path)
    with pytest.raises(ValueError, match="split"):
        RAGTask("hotpotqa", "test", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown RAG dataset"):
        RAGTask("squad")


# ------------------------------------------------------------------------------ named ids (issue 28, item 12)
def _shown(prompt: str) -> list[str]:
    """The ids listed in a view's documents section."""
    if "Documents:\n" not in prompt:
        return []
    return [line.split("]")[0][1:] for line in prompt.split("Documents:\n", 1)[1].splitlines() if line.startswith("[D")]


def test_naming_a_corpus_id_never_reveals_an_unseen_document():
    """The selector names every support document, the rewriter names ids too: only ids that
    agent was shown reach the filter; the others are counted and flagged."""
    env = marft_envs.make("rag-quartet-v0")
    env.reset(options={"problem_index": 1})
    p = env.problem
    unseen = [d.id for d in env.task.documents(p)][:40]
    env.step("query: " + p.question + "\n" + " ".join(unseen))  # the rewriter is shown nothing
    sel_ids = _shown(env.observe("selector")["prompt"])
    hidden = [i for i in p.meta["support"] if i not in sel_ids]
    assert hidden  # problem 1's second support document is not retrieved for the selector
    env.step("Useful: " + ", ".join(hidden + sel_ids[:1]))
    filt = _shown(env.observe("filter")["prompt"])
    assert filt == sel_ids[:1]  # before the fix: the hidden support documents were shown too
    env.step("Keep " + " ".join(hidden))  # the filter was not shown them either: nothing is kept
    gen = _shown(env.observe("generator")["prompt"])
    assert not set(hidden) & set(gen)  # what the generator reads comes from the selector's shown pick
    env.step("Answer: x")
    details = env.infos["generator"]["grade"]["details"]
    assert details["unseen_doc_ids"] >= len(unseen) and "unseen_doc_ids" in env.infos["generator"]["flags"]
    assert details["docs_shown"] == len(gen) and details["support_recall"] <= 0.5


def test_searched_documents_may_be_named_in_that_episode_only():
    env = marft_envs.make("rag-quartet-v0")
    env.reset(options={"problem_index": 1})
    p = env.problem
    second = p.meta["support"][1]
    title = env.task.documents(p)[int(second[1:])].title
    env.step("query: " + p.question)
    env.step('<tool_call>{"name": "search", "arguments": {"query": "' + title + '", "k": 3}}</tool_call>')
    env.step(f"Useful: {second}")
    assert _shown(env.observe("filter")["prompt"]) == [second]
    copy = __import__("copy").deepcopy(env)  # a copy keeps what the episode showed
    assert _shown(copy.observe("filter")["prompt"]) == [second]
    restored = __import__("pickle").loads(__import__("pickle").dumps(env))
    assert _shown(restored.observe("filter")["prompt"]) == [second]
    # A new episode on the same problem: the earlier search does not count.
    env.reset(options={"problem_index": 1})
    env.step("query: " + p.question)
    env.step(f"Useful: {second}")
    assert "Documents: none were selected." in env.observe("filter")["prompt"]
