"""Case cards for the doctor dialogue: a procedural generator (offline) and a public-data loader.

A :class:`Case` is what the simulated patient knows: the hidden ``condition``, the
``facts`` (symptom key -> the patient's words), the ``opening`` complaint and the
``candidates`` the doctor must choose from. Facts are keyed by the symptom vocabulary
:data:`SYMPTOMS`, each key with the question words that ask about it.

* :func:`generate_case` (default, offline): seeded and deterministic; conditions from
  :data:`CONDITIONS`, each with core symptoms (always present) and optional ones
  (present with probability ``1 - noise``); difficulty knobs: ``n_candidates`` (how many
  conditions to choose from), ``noise``, and ``confusable`` (default True: EVERY candidate
  lists the opening complaint among its symptoms and the condition is drawn uniformly
  among the candidates, so before the first question each candidate is equally likely and
  a doctor who asks nothing is right ``1 / n_candidates`` of the time). To make that hold,
  a confusable case draws its opening first, from the symptoms that at least
  ``n_candidates`` conditions list (:func:`confusable_openings`: fever, cough, sudden
  onset, headache, fatigue for 4; fever and headache for 6), and the opening may be an
  optional symptom of the condition (the patient then has it). No symptom is shared by
  more than 6 conditions, so ``confusable=True`` with ``n_candidates > 6`` is refused
  with a ValueError; eczema (whose symptoms are shared by at most 3 conditions) is never
  a candidate of a confusable case with 4 or more candidates. ``confusable=False``:
  the condition is drawn uniformly, the opening from its core symptoms and the other
  candidates at random (often none of them explains the opening: an easy setting).
* :func:`load_cases` (users with internet, or local JSONL): Gretel's
  ``gretelai/symptom_to_diagnosis`` on the Hugging Face Hub (Apache-2.0; 22 diagnoses;
  fields ``input_text``: the patient's description, ``output_text``: the diagnosis;
  splits ``train`` (853) and ``test`` (212)), or a local JSONL file with the same fields.
  Each sentence of ``input_text`` becomes a fact; a fact is revealed when a question
  shares a content word with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CONDITIONS", "HUB_DATASET", "SYMPTOMS", "Case", "confusable_openings", "generate_case", "load_cases"]

#: symptom key -> (question words that ask about it, the patient's words when present)
SYMPTOMS: dict[str, tuple[tuple[str, ...], str]] = {
    "fever": (("fever", "temperature", "feverish", "hot"), "I have a fever"),
    "cough": (("cough", "coughing"), "I have been coughing"),
    "phlegm": (("phlegm", "mucus", "sputum", "productive"), "I cough up thick phlegm"),
    "sore_throat": (("throat", "swallow", "swallowing"), "my throat is sore"),
    "runny_nose": (("runny", "nose", "sneeze", "sneezing", "congested", "congestion"), "my nose is runny"),
    "itchy_eyes": (("eyes", "itchy", "itching", "watery"), "my eyes are itchy and watery"),
    "body_aches": (("aches", "muscle", "muscles", "body"), "my whole body aches"),
    "breathless": (("breath", "breathing", "breathless", "wheeze", "wheezing"), "I get short of breath and wheeze"),
    "headache": (("headache", "head"), "I have a headache"),
    "one_sided": (("side", "one-sided", "sided", "throbbing"), "the pain is throbbing on one side"),
    "light": (("light", "bright", "photophobia"), "bright light bothers me"),
    "nausea": (("nausea", "nauseous", "sick", "vomit", "vomiting"), "I feel sick and have vomited"),
    "diarrhoea": (("diarrhoea", "diarrhea", "stool", "stools", "bowel"), "I have diarrhoea"),
    "belly_pain": (("belly", "stomach", "abdomen", "abdominal", "tummy"), "my belly hurts"),
    "lower_right": (("right", "lower", "where"), "the pain is in the lower right of my belly"),
    "burning_urine": (("urine", "urinate", "urinating", "pee", "peeing", "burning"), "it burns when I pee"),
    "frequent_urine": (("often", "frequent", "frequently", "bathroom", "toilet"), "I need the toilet very often"),
    "rash": (("rash", "skin", "spots", "itchy skin"), "I have an itchy rash"),
    "seasonal": (("season", "seasonal", "spring", "pollen", "allergy", "allergies"), "it happens every spring"),
    "exercise": (("exercise", "running", "exertion", "sport"), "it gets worse when I exercise"),
    "sudden": (("sudden", "suddenly", "start", "started", "onset", "begin", "began"), "it started suddenly"),
    "days": (("long", "days", "weeks", "duration", "since"), "it has lasted about three days"),
    "fatigue": (("tired", "fatigue", "exhausted", "energy", "weak"), "I feel very tired"),
}

#: condition -> (core symptoms, optional symptoms)
CONDITIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "influenza": (("fever", "body_aches", "cough", "sudden"), ("headache", "fatigue", "sore_throat")),
    "common cold": (("runny_nose", "sore_throat"), ("cough", "headache", "days")),
    "strep throat": (("sore_throat", "fever"), ("headache", "sudden", "fatigue")),
    "pneumonia": (("cough", "phlegm", "fever", "breathless"), ("fatigue", "days")),
    "asthma": (("breathless", "exercise"), ("cough", "seasonal")),
    "hay fever": (("runny_nose", "itchy_eyes", "seasonal"), ("headache", "cough")),
    "migraine": (("headache", "one_sided", "light"), ("nausea", "sudden")),
    "gastroenteritis": (("diarrhoea", "nausea", "belly_pain"), ("fever", "sudden")),
    "appendicitis": (("belly_pain", "lower_right", "nausea"), ("fever", "sudden")),
    "urinary tract infection": (("burning_urine", "frequent_urine"), ("belly_pain", "fever")),
    "eczema": (("rash",), ("itchy_eyes", "seasonal")),
    "anaemia": (("fatigue",), ("breathless", "headache")),
}

#: The Hub data set :func:`load_cases` reads (fields ``input_text``, ``output_text``).
HUB_DATASET = "gretelai/symptom_to_diagnosis"

_WORD_RE = re.compile(r"[a-z][a-z'-]+")
_STOPWORDS = frozenset(
    "i i'm i've me my myself we you your the a an and or but if of to in on at for with from by is are "
    "was were be been being have has had do does did so very really also some any this that these those "
    "it its it's there their they them he she his her not no yes can could would should will just when "
    "what which who how all about into out up down over more most other than too been like feel feeling "
    "get got getting lot lots much many been well still even because as".split()
)


@dataclass(frozen=True)
class Case:
    """A hidden case card.

    Attributes:
        id: stable id (``"procedural/train/17"``, ``"symptom_to_diagnosis/test/3"``).
        condition: the correct diagnosis (one of ``candidates``).
        facts: ``{fact key: the patient's words}``; never shown to the doctor whole.
        opening: the key of the fact the patient volunteers in the first message.
        candidates: the conditions the doctor chooses from (sorted).
        keywords: ``{fact key: question words that ask about it}``.
        meta: JSON-safe extras (source, difficulty knobs).
    """

    id: str
    condition: str
    facts: dict[str, str]
    opening: str
    candidates: tuple[str, ...]
    keywords: dict[str, tuple[str, ...]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for logs; this is the card the respondent must never reveal whole)."""
        return {"id": self.id, "condition": self.condition, "facts": dict(self.facts),
                "opening": self.opening, "candidates": list(self.candidates),
                "keywords": {k: list(v) for k, v in self.keywords.items()}, "meta": dict(self.meta)}


def _symptoms_of(condition: str) -> tuple[str, ...]:
    core, optional = CONDITIONS[condition]
    return core + optional


def confusable_openings(n_candidates: int) -> list[str]:
    """Symptoms that at least ``n_candidates`` conditions list (core or optional): the
    openings a ``confusable`` case can start from (sorted; empty when none is shared enough)."""
    return sorted(s for s in SYMPTOMS if sum(s in _symptoms_of(c) for c in CONDITIONS) >= n_candidates)


#: The most conditions that share one symptom (6: fever, headache): the largest confusable case.
_MOST_SHARED = max(sum(s in _symptoms_of(c) for c in CONDITIONS) for s in SYMPTOMS)
_NO_CONFUSABLE = ("confusable cases need an opening complaint that all {n} candidates list, and no symptom "
                  "is shared by more than {most} conditions: use n_candidates <= {most}, or confusable=False")


def generate_case(index: int, split: str = "train", *, n_candidates: int = 4, noise: float = 0.3,
                  confusable: bool = True) -> Case:
    """Procedural case ``index`` of ``split`` (deterministic: same arguments, same case).

    Example:
        >>> case = generate_case(0)
        >>> case.condition in case.candidates and case.opening in case.facts
        True
        >>> generate_case(0) == case
        True
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 2 <= n_candidates <= len(CONDITIONS):
        raise ValueError(f"n_candidates must be in [2, {len(CONDITIONS)}], got {n_candidates!r}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise!r}")
    rng = np.random.default_rng([("train", "test").index(split), 17, int(index)])
    names = sorted(CONDITIONS)
    if confusable:
        # Opening first, then n conditions that all list it, then the condition uniformly among
        # them: given what the doctor sees (opening, candidates) every candidate is equally
        # likely, so a doctor who asks nothing is right 1 / n_candidates of the time.
        openings = confusable_openings(n_candidates)
        if not openings:
            raise ValueError(_NO_CONFUSABLE.format(n=n_candidates, most=_MOST_SHARED))
        opening = openings[int(rng.integers(len(openings)))]
        explain = [c for c in names if opening in _symptoms_of(c)]
        candidates = tuple(sorted(str(c) for c in rng.choice(explain, size=n_candidates, replace=False)))
        condition = candidates[int(rng.integers(n_candidates))]
        core, optional = CONDITIONS[condition]
        # the opening may be an optional symptom of the condition: this patient has it
        present = list(core) + [s for s in optional if s == opening or rng.random() >= noise]
    else:
        condition = names[int(rng.integers(len(names)))]
        core, optional = CONDITIONS[condition]
        present = list(core) + [s for s in optional if rng.random() >= noise]
        opening = core[int(rng.integers(len(core)))]
        others = [c for c in names if c != condition]
        rng.shuffle(others)
        candidates = tuple(sorted([condition, *others[: n_candidates - 1]]))
    facts = {key: SYMPTOMS[key][1] for key in sorted(present)}
    return Case(
        id=f"procedural/{split}/{index}", condition=condition, facts=facts, opening=opening,
        candidates=candidates, keywords={k: SYMPTOMS[k][0] for k in SYMPTOMS},
        meta={"source": "procedural", "n_candidates": n_candidates, "noise": noise, "confusable": confusable},
    )


def _content_words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(w for w in _WORD_RE.findall(text.lower()) if w not in _STOPWORDS and len(w) > 2))


def case_from_record(record: Mapping[str, Any], index: int, source: str, candidates: Sequence[str]) -> Case:
    """A case from a ``{"input_text", "output_text"}`` record: one fact per sentence."""
    text, label = str(record["input_text"]), str(record["output_text"]).strip().lower()
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    facts = {f"s{i}": s for i, s in enumerate(sentences)} or {"s0": text}
    return Case(
        id=f"{source}/{index}", condition=label, facts=facts, opening="s0",
        candidates=tuple(sorted(set(candidates) | {label})),
        keywords={k: _content_words(v) for k, v in facts.items()}, meta={"source": source},
    )


def load_cases(split: str = "test", *, path: str | Path | None = None, data_dir: str | Path | None = None,
               n_candidates: int | None = None) -> list[Case]:
    """Cases from ``path`` (JSONL with ``input_text`` / ``output_text``), else from
    ``<data_dir>/symptom_to_diagnosis/<split>.jsonl``, else from the Hub (:data:`HUB_DATASET`).

    Candidates are every diagnosis of the file (22 for Gretel's set), or, with
    ``n_candidates``, the true one plus the next ``n_candidates - 1`` labels in sorted order
    (deterministic).

    Raises:
        FileNotFoundError / ValueError: with what to provide, when no source is usable.
    """
    records: list[dict[str, Any]]
    file = Path(path) if path else (Path(data_dir) / "symptom_to_diagnosis" / f"{split}.jsonl" if data_dir else None)
    if file is not None:
        if not file.is_file():
            raise FileNotFoundError(f"no case file {file}: give a JSONL file with 'input_text' and 'output_text' per line")
        records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        source = file.stem
    else:
        try:
            # deferred: datasets is heavy: it loads only when data is fetched
            import datasets

            records = [dict(r) for r in datasets.load_dataset(HUB_DATASET, split=split)]
        except Exception as e:
            raise ValueError(
                f"could not load {HUB_DATASET!r} split {split!r} from the Hub ({type(e).__name__}: {e}); "
                "offline, use cases='procedural' or cases_path=<JSONL with input_text/output_text>"
            ) from e
        source = f"symptom_to_diagnosis/{split}"
    bad = [i for i, r in enumerate(records) if not {"input_text", "output_text"} <= set(r)]
    if bad:
        raise ValueError(f"records {bad[:5]} lack 'input_text' / 'output_text'")
    labels = sorted({str(r["output_text"]).strip().lower() for r in records})
    out = []
    for i, r in enumerate(records):
        label = str(r["output_text"]).strip().lower()
        if n_candidates:
            j = labels.index(label)
            cands = [labels[(j + d) % len(labels)] for d in range(min(n_candidates, len(labels)))]
        else:
            cands = labels
        out.append(case_from_record(r, i, source, cands))
    return out
