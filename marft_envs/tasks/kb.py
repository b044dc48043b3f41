"""A procedural multi-hop knowledge base: fictional entities, relations, questions, a corpus.

Everything is generated from integers, offline and deterministically, so RAG
tests and quickstarts need no network and no data files. A *world* holds
people, cities, countries and companies with four relations::

    person  --born_in-->            city
    person  --works_for-->          company
    company --founded_by-->         person
    company --headquartered_in-->   city
    city    --located_in-->         country

Each entity has one document stating its facts (``"Mira Kalven was born in
Tovaris. Mira Kalven works for Zorbex Systems."``). Questions follow relation
paths of 1 to 3 hops (``"In which country was the founder of Zorbex Systems
born?"`` is ``founded_by -> born_in -> located_in``); the documents of the
entities on the path are the *supporting* documents, every other document is a
distractor. Look-alike entities (``distractors`` per person and company: the
same surname with another first name, or the same company stem with another
suffix) make lexical retrieval pick wrong documents, like near-duplicate
Wikipedia titles do.

Knobs (like arith's): ``hops`` (allowed path lengths, default ``(1, 2, 3)``),
``n_people`` (world size; cities, companies and countries scale with it),
``distractors`` (look-alikes per person/company, default 1) and ``seed``
(the world). Train and test use different worlds (the split is mixed into the
seed), so a test question never names an entity seen in training.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KBQuestion", "KnowledgeBase", "RELATIONS", "TEMPLATES"]

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "n", "r", "l", "s", "x", "th", "nd", "rk")
_COMPANY_SUFFIX = ("Systems", "Labs", "Works", "Holdings", "Dynamics", "Foods", "Motors", "Textiles")
_INDUSTRY = ("software", "food", "shipping", "textile", "energy", "robotics", "publishing", "mining")
_JOBS = ("engineer", "chemist", "painter", "pilot", "teacher", "architect", "farmer", "historian")

#: relation -> (subject type, object type, phrase used in a document)
RELATIONS: dict[str, tuple[str, str]] = {
    "born_in": ("person", "city"),
    "works_for": ("person", "company"),
    "founded_by": ("company", "person"),
    "headquartered_in": ("company", "city"),
    "located_in": ("city", "country"),
}

#: (relation path, question template over the start entity ``{x}``)
TEMPLATES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("born_in",), "In which city was {x} born?"),
    (("works_for",), "Which company does {x} work for?"),
    (("founded_by",), "Who founded {x}?"),
    (("headquartered_in",), "In which city is {x} headquartered?"),
    (("located_in",), "In which country is the city of {x}?"),
    (("born_in", "located_in"), "In which country was {x} born?"),
    (("founded_by", "born_in"), "In which city was the founder of {x} born?"),
    (("headquartered_in", "located_in"), "In which country is {x} headquartered?"),
    (("works_for", "headquartered_in"), "In which city is the company that {x} works for headquartered?"),
    (("works_for", "founded_by"), "Who founded the company that {x} works for?"),
    (("founded_by", "born_in", "located_in"), "In which country was the founder of {x} born?"),
    (("works_for", "headquartered_in", "located_in"), "In which country is the company that {x} works for headquartered?"),
    (("works_for", "founded_by", "born_in"), "In which city was the founder of the company that {x} works for born?"),
)


@dataclass(frozen=True)
class KBQuestion:
    """One question: its text, gold answer, hop count, relation path and supporting documents."""

    question: str
    answer: str
    hops: int
    path: tuple[str, ...]
    start: str
    supporting: tuple[int, ...]


@dataclass
class KnowledgeBase:
    """A generated world: ``entities[name] = {"type", relation: object, ...}``, ``docs``, ``questions``.

    Build with :meth:`generate`. ``docs`` is a list of ``(title, text)``; ``doc_of[name]``
    is the index of an entity's document.
    """

    entities: dict[str, dict[str, Any]] = field(default_factory=dict)
    docs: list[tuple[str, str]] = field(default_factory=list)
    doc_of: dict[str, int] = field(default_factory=dict)
    questions: list[KBQuestion] = field(default_factory=list)

    @classmethod
    def generate(
        cls,
        *,
        seed: int = 0,
        split: str = "train",
        n_people: int = 40,
        distractors: int = 1,
        hops: tuple[int, ...] = (1, 2, 3),
    ) -> KnowledgeBase:
        """A world and its questions, a pure function of the arguments."""
        if not isinstance(n_people, int) or n_people < 4:
            raise ValueError(f"n_people must be an integer >= 4, got {n_people!r}")
        if not isinstance(distractors, int) or not 0 <= distractors <= 5:
            raise ValueError(f"distractors must be an integer in [0, 5], got {distractors!r}")
        hops = tuple(sorted(set(int(h) for h in hops)))
        if not hops or not set(hops) <= {1, 2, 3}:
            raise ValueError(f"hops must be a non-empty subset of (1, 2, 3), got {hops!r}")
        digest = hashlib.sha256(f"kb/{seed}/{split}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        kb = cls()
        used: set[str] = set()

        def word(syllables: int) -> str:
            for _ in range(1000):
                w = "".join(
                    _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] + _CODAS[rng.integers(len(_CODAS))]
                    for _ in range(syllables)
                ).capitalize()
                if w not in used:
                    used.add(w)
                    return w
            raise RuntimeError("name space exhausted")  # pragma: no cover - 20*8*9 syllables

        def pick(names: list[str]) -> str:
            return names[int(rng.integers(len(names)))]

        n_countries = max(3, n_people // 8)
        n_cities = max(4, n_people // 2)
        n_companies = max(3, n_people // 2)
        countries = [word(2) for _ in range(n_countries)]
        cities = [word(2) for _ in range(n_cities)]
        for c in countries:
            kb.entities[c] = {"type": "country"}
        for c in cities:
            kb.entities[c] = {"type": "city", "located_in": pick(countries)}
        surnames = [word(2) for _ in range(n_people)]
        people = [f"{word(1)} {s}" for s in surnames]
        stems = [word(2) for _ in range(n_companies)]
        companies = [f"{s} {_COMPANY_SUFFIX[rng.integers(len(_COMPANY_SUFFIX))]}" for s in stems]
        for c in companies:
            kb.entities[c] = {"type": "company", "headquartered_in": pick(cities), "industry": pick(list(_INDUSTRY))}
        for p in people:
            kb.entities[p] = {"type": "person", "born_in": pick(cities), "works_for": pick(companies), "job": pick(list(_JOBS))}
        for c in companies:
            kb.entities[c]["founded_by"] = pick(people)
        # Look-alikes: same surname / company stem, different facts. They are entities too
        # (with documents) but never the start of a question.
        lookalikes: list[str] = []
        for p in people:
            for _ in range(distractors):
                name = f"{word(1)} {p.split(' ', 1)[1]}"
                kb.entities[name] = {"type": "person", "born_in": pick(cities), "works_for": pick(companies), "job": pick(list(_JOBS))}
                lookalikes.append(name)
        for c in companies:
            stem, suffix = c.split(" ", 1)
            others = [s for s in _COMPANY_SUFFIX if s != suffix]
            for j in range(distractors):
                name = f"{stem} {others[(j + int(rng.integers(len(others)))) % len(others)]}"
                if name in kb.entities:
                    continue
                kb.entities[name] = {"type": "company", "headquartered_in": pick(cities), "industry": pick(list(_INDUSTRY)),
                                     "founded_by": pick(people)}
                lookalikes.append(name)
        for name in sorted(kb.entities, key=lambda n: int.from_bytes(hashlib.sha256(f"{seed}{n}".encode()).digest()[:4], "little")):
            kb.doc_of[name] = len(kb.docs)
            kb.docs.append((name, _describe(name, kb.entities[name])))
        starts = {"person": people, "company": companies, "city": cities}
        for path, template in TEMPLATES:
            if len(path) not in hops:
                continue
            for x in starts[RELATIONS[path[0]][0]]:
                node, chain = x, [x]
                for rel in path:
                    node = kb.entities[node][rel]
                    chain.append(node)
                kb.questions.append(KBQuestion(template.format(x=x), node, len(path), path, x,
                                               tuple(kb.doc_of[e] for e in chain[:-1])))
        order = rng.permutation(len(kb.questions))
        kb.questions = [kb.questions[int(i)] for i in order]
        return kb


def _describe(name: str, e: dict[str, Any]) -> str:
    t = e["type"]
    if t == "person":
        return (f"{name} is {_a(e['job'])}. {name} was born in {e['born_in']}. "
                f"{name} works for {e['works_for']}.")
    if t == "company":
        return (f"{name} is {_a(e['industry'])} company founded by {e['founded_by']}. "
                f"The headquarters of {name} are in {e['headquartered_in']}.")
    if t == "city":
        return f"{name} is a city in {e['located_in']}."
    return f"{name} is a country."


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun
