"""Equal-budget baselines: does training the team beat training one agent, or sampling it more?

    python benchmarks/equal_budget.py --jobs 2 --out runs/equal_budget                 # easy arith level, ~6 duo steps per run
    python benchmarks/equal_budget.py --jobs 2 --token-budget 3500 --eval-n 100 --num-envs-eval 50 \\
        --out runs/equal_budget                                                      # the run of docs/results.md (~3 duo steps)
    python benchmarks/equal_budget.py --jobs 2 --env-kwargs '{}' --token-budget 3500 --eval-n 100 \\
        --num-envs-eval 50 --out runs/equal_budget-default                           # the default arith level
    python benchmarks/equal_budget.py --jobs 2 --solo-env rag-solo-v0 --duo-env rag-quartet-v0 \\
        --env-kwargs '{"hops": [1], "k": 3, "max_doc_chars": 300}' --max-new-tokens 24 --token-budget 1000 \\
        --set num_envs=8 --eval-n 32 --num-envs-eval 32 --out runs/equal_budget-rag \\
        --systems untrained-solo,untrained-duo,solo-grpo,duo-marft-action,duo-grpo   # RAG: solo vs the quartet
    python benchmarks/equal_budget.py --report-only --out runs/equal_budget          # rebuild the report
    python benchmarks/equal_budget.py --status --out runs/equal_budget               # where each job stands; runs nothing
    python benchmarks/equal_budget.py --model tiny-random --token-budget 40 --eval-n 4 --seeds 0,1 \\
        --set num_envs=2 --max-new-tokens 4 --out /tmp/eb                           # smoke

Systems (every trained one gets the same budget of GENERATED TRAINING TOKENS,
``--token-budget``, counted from the trainer's ``rollout/tokens`` per step; a step that
would cross the budget collects fewer groups of episodes (:func:`fit_groups`), training
stops at the first step that reaches it, and the exact count is recorded): untrained solo; solo trained with GRPO; solo maj@k at the untrained duo's
inference tokens (k = round(duo tokens/episode / solo tokens/episode), at least 3,
sampled at temperature 0.7); untrained duo; duo trained with marft-action, marft-token,
grpo (agent-wise normalisation, Dr. MAS) and ippo; the MALT trio and the ReMA duo trained
with GRPO (last in the queue). Recipe: the quickstart's (``marft_algos.cli``), GRPO
group size 4. Held-out: test problems 0..eval_n-1, greedy, the same token limits.

Each (system, seed) is an independent job writing ``<records>/<system>/seed<k>.json``
(``--records``, default ``<out>/runs``: per-problem 0/1 correctness, tokens, steps, minutes,
per-step metrics); an existing JSON is skipped, so the run can be stopped and restarted,
and a trained job continues from its last checkpoint in ``<out>/rundirs``. The JSONs are
small: keep them under version control (``--records``) and a report can pool seeds run in
different places, where the checkpoints are not kept. ``--jobs N`` runs N jobs at once as
subprocesses with one thread each. The report (``equal_budget.md/.csv/.json/.png``) has
per-system means over seeds, Wilson intervals of the pooled accuracy and paired
bootstrap intervals of the differences (:func:`paired_bootstrap`); a system without a
JSON is reported as "not run". A MARFT job whose collapse guard gives up
(:class:`~marft_algos.recovery.CollapseError`) ends there, short of the budget, on its last
good weights: it is evaluated and recorded like any job (``stopped`` in its JSON, the
report's ``status``), never dropped, so a system that collapses keeps its seeds in the pool.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import json_option, markdown_table, versions, wilson, write_csv, write_json  # noqa: E402
from marft_algos.cli import (  # noqa: E402
    QUICKSTART_ARITH_LEVEL,
    QUICKSTART_RECIPE,
    TOOL_ROLE_MIN_TOKENS,
    quickstart_sampling,
    tool_roles,
)
from marft_algos.recovery import CollapseError  # noqa: E402

__all__ = ["main", "build_parser", "paired_bootstrap", "fit_groups", "SYSTEMS", "System", "queue", "COMPARISONS", "tokens_to_target", "TABLE_COLUMNS", "DIFF_COLUMNS", "PER_SEED_COLUMNS"]


@dataclasses.dataclass(frozen=True)
class System:
    """One system of the comparison: ``env`` is "solo", "duo", "malt" or "rema" (the env flag that plays it).

    ``warm``: RL starts from per-role adapters that ``marft sft`` trained on the env's scripted
    demonstrations (issue 30 section 2; the warm systems of one seed share one SFT run, see
    ``_warm_start``); ``cold`` names its cold twin, the same RL from fresh
    adapters, which the report pairs it with (warm - cold). ``env_overrides``: env keywords of
    this system on top of ``--env-kwargs`` (e.g. a compact hand-off, issue 30 section 3).
    ``tier``: queue order (0 the baselines of issue 18, 1 the credit-assignment systems of
    issue 30, 2 the MALT/ReMA extras, 3 the staleness check of issue 31: one rollout worker at
    ``max_staleness`` 0, 1, 2).
    """

    name: str
    env: str
    algo: str | None = None  # None: untrained
    overrides: tuple[tuple[str, Any], ...] = ()
    majority: bool = False
    tier: int = 0
    warm: bool = False
    cold: str | None = None
    env_overrides: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.warm and not self.cold:
            raise ValueError(f"warm system {self.name!r} needs cold=<the same RL from fresh adapters> for its warm - cold difference")

    @property
    def trained(self) -> bool:
        """True when the system is trained (its seeds are training seeds)."""
        return self.algo is not None

    @property
    def core(self) -> bool:
        """True for the baselines of issue 18 (queued first)."""
        return self.tier == 0


_AGENTWISE = (("normalize_advantages", "agent"),)
_BRANCH = (("branching", 2),)
_BUDGET_TREE = (("branch_expand", "random"),)  # with _BRANCH: one random sibling branches on, the others play out as chains
_KL_TO_SFT = (("reference", "init"), ("beta", 0.04))
_RECORD = (("handoff", "record"),)  # the actor sees a compact record of the reasoner's claims and answer (PACT)
_ANSWER = (("handoff", "answer"),)  # the actor sees the reasoner's final answer only
_MASK_CUT = (("mask_length_stops", True),)
_WHITEN = (("normalize_advantages", "batch"),)
SYSTEMS: list[System] = [
    System("untrained-solo", "solo"),
    System("untrained-duo", "duo"),
    System("solo-majk", "solo", majority=True),
    System("solo-grpo", "solo", "grpo"),
    System("duo-marft-action", "duo", "marft-action"),
    System("duo-marft-token", "duo", "marft-token"),
    System("duo-grpo", "duo", "grpo", _AGENTWISE),
    System("duo-ippo", "duo", "ippo"),
    # credit assignment (issue 30): branching rollouts' counterfactual credit, and the SFT warm start
    System("duo-grpo-branch", "duo", "grpo", _AGENTWISE + _BRANCH, tier=1),
    System("duo-marft-action-branch", "duo", "marft-action", _BRANCH, tier=1),
    System("solo-grpo-warm", "solo", "grpo", tier=1, warm=True, cold="solo-grpo"),
    System("duo-grpo-warm", "duo", "grpo", _AGENTWISE, tier=1, warm=True, cold="duo-grpo"),
    System("duo-marft-action-warm", "duo", "marft-action", tier=1, warm=True, cold="duo-marft-action"),
    System("duo-grpo-branch-warm", "duo", "grpo", _AGENTWISE + _BRANCH, tier=1, warm=True, cold="duo-grpo-branch"),
    System("duo-marft-action-branch-warm", "duo", "marft-action", _BRANCH, tier=1, warm=True, cold="duo-marft-action-branch"),
    # the budgeted tree (MALT / PettingLLMs): 1 + actions leaves a root instead of 2^actions, for the RAG quartet,
    # whose full tree (16 leaves, 30 agent turns a root) bought 3 steps of 35,000 tokens
    System("duo-grpo-branch-budget", "duo", "grpo", _AGENTWISE + _BRANCH + _BUDGET_TREE, tier=1),
    System("duo-marft-action-branch-budget", "duo", "marft-action", _BRANCH + _BUDGET_TREE, tier=1),
    # the warm start held near its SFT policy: a KL penalty (beta 0.04, DeepSeekMath's GRPO value) to the SFT weights
    System("duo-grpo-warm-kl", "duo", "grpo", _AGENTWISE + _KL_TO_SFT, tier=1, warm=True, cold="duo-grpo"),
    # warm MARFT with DAPO's overlong filtering: no policy gradient for replies cut at the token limit
    # (warm MARFT's reasoner ran to its 64-token limit on seeds 0 and 1, and the team reward never showed it)
    System("duo-marft-action-warm-mask", "duo", "marft-action", _MASK_CUT, tier=1, warm=True, cold="duo-marft-action"),
    # warm MARFT with whitened advantages (the reference implementation's normalisation): it held the reasoner
    # under its token limit on every seed where the default (raw R - V) ran into it on two of three
    System("duo-marft-action-warm-whiten", "duo", "marft-action", _WHITEN, tier=1, warm=True, cold="duo-marft-action"),
    # whitening without the warm start: is it the whitening, or whitening after SFT?
    System("duo-marft-action-whiten", "duo", "marft-action", _WHITEN, tier=1),
    # compact hand-offs (PACT): the actor reads a record of the reasoner's claims and answer, or its final answer
    # only; trained: the answer view (on arith the record is as long as the text, and it misled the untrained actor)
    System("untrained-duo-record", "duo", tier=1, env_overrides=_RECORD),
    System("untrained-duo-answer", "duo", tier=1, env_overrides=_ANSWER),
    System("duo-marft-action-answer", "duo", "marft-action", tier=1, env_overrides=_ANSWER),
    System("malt-grpo", "malt", "grpo", _AGENTWISE, tier=2),
    System("rema-grpo", "rema", "grpo", _AGENTWISE, tier=2),
    # asynchronous rollout workers (issue 31): does learning suffer at staleness 1 and 2?
    *[System(f"duo-grpo-async-s{k}", "duo", "grpo", _AGENTWISE + (("rollout_workers", 1), ("max_staleness", k)), tier=3) for k in (0, 1, 2)],
]
BY_NAME = {s.name: s for s in SYSTEMS}
_TEAMS = ("duo-marft-action", "duo-marft-token", "duo-grpo", "duo-ippo")
_BRANCHED = ("duo-grpo-branch", "duo-marft-action-branch", "duo-grpo-branch-warm", "duo-marft-action-branch-warm")
_BUDGETED = ("duo-grpo-branch-budget", "duo-marft-action-branch-budget")
#: Paired differences of the report: (A, B) reads "A - B".
COMPARISONS: list[tuple[str, str]] = [
    *[(d, "solo-grpo") for d in _TEAMS],
    *[(d, "untrained-duo") for d in _TEAMS],
    ("duo-marft-action", "duo-grpo"),
    ("duo-marft-token", "duo-grpo"),
    *[(d, "solo-majk") for d in _TEAMS],
    ("solo-grpo", "untrained-solo"),
    *[(t, "solo-grpo") for t in ("malt-grpo", "rema-grpo")],
    *[(t, "duo-grpo") for t in ("malt-grpo", "rema-grpo")],
    ("untrained-duo", "untrained-solo"),
    ("solo-majk", "untrained-solo"),  # does sampling k and voting beat one greedy answer?
    # issue 30: team - solo, branching - plain, warm - cold
    *[(d, "solo-grpo") for d in _BRANCHED[:2]],
    *[(d, "solo-grpo-warm") for d in ("duo-grpo-warm", "duo-marft-action-warm", *_BRANCHED[2:], "duo-grpo-warm-kl")],
    *[(d, d.replace("-branch", "")) for d in _BRANCHED],
    *[(s.name, s.cold) for s in SYSTEMS if s.cold],
    ("duo-grpo-warm-kl", "duo-grpo-warm"), ("duo-grpo-warm-kl", "solo-grpo"), ("duo-grpo-warm-kl", "duo-marft-action"),
    ("duo-marft-action-warm-mask", "duo-marft-action-warm"), ("duo-marft-action-warm-mask", "solo-grpo-warm"),
    ("duo-marft-action-warm-whiten", "duo-marft-action-warm"), ("duo-marft-action-warm-whiten", "solo-grpo-warm"),
    ("duo-marft-action-whiten", "duo-marft-action"), ("duo-marft-action-whiten", "solo-grpo"),
    ("duo-marft-action-warm-whiten", "duo-marft-action-whiten"),
    ("duo-grpo-warm", "solo-grpo"),  # the warm team against the cold solo agent at equal RL tokens (the tool tasks' question)
    # did training the team move it at all? (the untrained duo is the floor every team starts from)
    *[(d, "untrained-duo") for d in (*_BRANCHED[:2], "duo-grpo-warm-kl")],
    ("duo-marft-action-answer", "duo-marft-action"), ("duo-marft-action-answer", "solo-grpo"),
    ("duo-marft-action-answer", "untrained-duo-answer"), ("untrained-duo-answer", "untrained-duo"), ("untrained-duo-record", "untrained-duo"),
    *[(d, "solo-majk") for d in _BRANCHED],
    # the budgeted tree against the team without branching, the full tree, the solo agent and the untrained team
    *[(d, d.replace("-branch-budget", "")) for d in _BUDGETED], *[(d, d.replace("-budget", "")) for d in _BUDGETED],
    *[(d, b) for d in _BUDGETED for b in ("solo-grpo", "untrained-duo")],
    # issue 31: staleness k - staleness 0, and the asynchronous run at staleness 0 against the synchronous one
    ("duo-grpo-async-s1", "duo-grpo-async-s0"), ("duo-grpo-async-s2", "duo-grpo-async-s0"), ("duo-grpo-async-s0", "duo-grpo"),
]
#: config fields a job's JSON keeps (what differs between systems)
CONFIG_KEPT = ("lr", "num_envs", "group_size", "normalize_advantages", "lora_r", "lora_alpha", "sampling_overrides", "branching", "branch_expand", "branch_depth", "init_from", "reference", "beta", "mask_length_stops",
               "rollout_workers", "max_staleness")
TABLE_COLUMNS = ["system", "env_id", "seeds", "mean_accuracy", "seed_accuracies", "pooled_ci", "problems", "train_tokens",
                 "steps", "train_minutes", "job_minutes", "job_cpu_minutes", "eval_tokens_per_episode", "eval_prompt_tokens_per_episode", "tool_call_rate", "status"]
DIFF_COLUMNS = ["a", "b", "difference", "ci_low", "ci_high", "significant", "seeds_a", "seeds_b"]
PER_SEED_COLUMNS = ["a", "b", "seed_a", "seed_b", "difference", "ci_low", "ci_high", "significant"]


# --------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, reps: int = 10_000, level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Paired bootstrap of mean_over_seeds(a) - mean_over_seeds(b) on the same problems.

    ``a`` and ``b`` are (seeds x problems) arrays of per-problem scores (0/1 correctness),
    column j of both the same problem. Each replicate draws the problems with replacement
    (the SAME draw for both systems: the pairing) and each system's seeds with replacement;
    the statistic is the difference of the means over seeds of the per-seed accuracies.
    Returns the point estimate on the full data and the percentile interval.
    """
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[1] != b.shape[1] or a.shape[1] == 0:
        raise ValueError(f"paired_bootstrap needs the same non-empty problem set for both systems, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=reps)  # (reps, n): how often each problem is drawn
    acc_a = counts @ a.T / n  # (reps, seeds_a): each seed's accuracy on the resampled problems
    acc_b = counts @ b.T / n
    pick_a = rng.integers(0, a.shape[0], size=(reps, a.shape[0]))
    pick_b = rng.integers(0, b.shape[0], size=(reps, b.shape[0]))
    stat = np.take_along_axis(acc_a, pick_a, 1).mean(1) - np.take_along_axis(acc_b, pick_b, 1).mean(1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return {"difference": float(a.mean() - b.mean()), "ci_low": float(lo), "ci_high": float(hi)}


def grad_spikes(norms: Sequence[float], factor: float = 3.0) -> int:
    """Steps whose gradient norm is above ``factor`` x the run's median (0 for an empty run or a zero median).

    >>> grad_spikes([1.0, 1.0, 1.2, 5.0])
    1
    """
    xs = [x for x in norms if x == x]
    if not xs:
        return 0
    med = float(np.median(xs))
    return sum(x > factor * med for x in xs) if med > 0 else 0


def grad_jumps(norms: Sequence[float], factor: float = 3.0, window: int = 5, min_history: int = 3) -> int:
    """Steps whose gradient norm is above ``factor`` x the median of the ``window`` non-zero norms
    before it (judged once ``min_history`` of them exist): a sudden rise against recent steps.

    Unlike :func:`grad_spikes` (against the whole run's median), a norm that decays over a run, or
    steps without signal (norm 0, as in an all-correct GRPO group), do not make earlier steps jumps.

    >>> grad_jumps([0.8, 0.4, 0.2, 0.1, 0.05, 0.02, 0.02])
    0
    >>> grad_jumps([0.1, 0.0, 0.1, 0.1, 0.0, 0.5, 0.1])
    1
    """
    history: list[float] = []
    jumps = 0
    for x in norms:
        if x != x or x <= 0:  # NaN or no gradient: neither a jump nor history
            continue
        recent = history[-window:]
        if len(recent) >= min_history and x > factor * float(np.median(recent)):
            jumps += 1
        history.append(x)
    return jumps


# --------------------------------------------------------------------------------------
# one job
# --------------------------------------------------------------------------------------


def fit_groups(tokens: int, groups: int, budget: int, full: int) -> int:
    """Groups of episodes for the next training step: a full step (``full`` groups), or, when a
    full step would cross ``budget``, as many groups as the rest of the budget buys at the
    tokens per group seen so far (at least one). Without it a system whose step is large
    (MALT, ReMA: 2-3k tokens) overshoots the budget by up to a whole step."""
    if groups == 0:
        return full  # no estimate yet: the first step is a full one
    per_group = tokens / groups
    return max(1, min(full, round((budget - tokens) / per_group)))


def _env_id(args: argparse.Namespace, kind: str) -> str:
    return {"solo": args.solo_env, "duo": args.duo_env, "malt": args.malt_env, "rema": args.rema_env}[kind]


def _sampling(env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, temperature: float = 0.7) -> dict[str, dict[str, Any]]:
    """The quickstart's per-role sampling (reasoner 64 / actor 24 new tokens; other roles 64; a role with tools at least
    ``TOOL_ROLE_MIN_TOKENS``), or --max-new-tokens for all."""
    key = json.dumps(env_kwargs, sort_keys=True)
    out = {}
    for a, s in _quickstart_sampling(env_id, key).items():
        s = {"max_new_tokens": 64, **s, "temperature": temperature}
        if args.max_new_tokens:
            s["max_new_tokens"] = args.max_new_tokens
            if a in _tool_roles(env_id, key) and args.max_new_tokens < TOOL_ROLE_MIN_TOKENS:
                print(f"[equal-budget] warning: --max-new-tokens {args.max_new_tokens} is below a tool call's length "
                      f"({TOOL_ROLE_MIN_TOKENS}) for {env_id}'s {a}: its calls will be cut", flush=True)
        out[a] = s
    return out


@functools.cache
def _quickstart_sampling(env_id: str, env_kwargs_json: str) -> dict[str, dict[str, Any]]:
    return quickstart_sampling(env_id, json.loads(env_kwargs_json))


@functools.cache
def _tool_roles(env_id: str, env_kwargs_json: str) -> frozenset[str]:
    return tool_roles(env_id, json.loads(env_kwargs_json))


def _agents(env_id: str, env_kwargs: dict[str, Any]) -> list[str]:
    import marft_envs

    return list(marft_envs.spec(env_id).agents_for(**env_kwargs))


def _env_kwargs(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """The system's env keywords: ``--env-kwargs`` and the system's own ``env_overrides`` on top."""
    return {**json.loads(args.env_kwargs), **dict(system.env_overrides)}


def _heldout(policy: Any, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, n: int | None = None) -> dict[str, Any]:
    """Greedy evaluation on test problems 0..n-1 (default ``--eval-n``) with the training token limits; per-problem correctness."""
    from marft_algos.evaluation import episode_score, episode_tool_calls, evaluate

    res = evaluate(policy, env_id, env_kwargs=env_kwargs, n=args.eval_n if n is None else n, split="test", num_envs=args.num_envs_eval, greedy=True,
                   sampling_overrides=_sampling(env_id, env_kwargs, args), seed=1234)
    d = res.to_dict()
    d["correct_per_problem"] = [int(bool(ep.correct)) for ep in res.episodes]
    # the grader's score (answer F1 in RAG), or the 0/1 correctness of an ungraded episode
    d["score_per_problem"] = [float(bool(ep.correct)) if (s := episode_score(ep)) is None else s for ep in res.episodes]
    d["tool_calls_per_problem"] = [episode_tool_calls(ep) for ep in res.episodes]
    return d


def _config(system: System, seed: int, args: argparse.Namespace, run_dir: Path, out: Path | None = None) -> tuple[Any, Any]:
    from marft_algos.config import apply_overrides, config_from_dict
    from marft_algos.registry import get_algorithm

    assert system.algo is not None
    spec = get_algorithm(system.algo)
    env_id = _env_id(args, system.env)
    env_kwargs = _env_kwargs(system, args)
    data: dict[str, Any] = {
        "env_id": env_id, "env_kwargs": env_kwargs, "model": args.model, "steps": args.max_steps, "seed": seed,
        "out_dir": str(run_dir), "progress": False, "save_every": 0, "transcript_every": 0,
        **QUICKSTART_RECIPE, "sampling_overrides": _sampling(env_id, env_kwargs, args),
    }
    if system.algo == "grpo":
        data["group_size"] = args.group_size
    names = {f.name for f in dataclasses.fields(spec.config_cls)}
    missing = [k for k, _ in system.overrides if k not in names]
    if missing:  # a system whose defining setting would be dropped is not that system
        raise SystemExit(f"{system.name}: {spec.config_cls.__name__} has no field {missing}")
    data.update(dict(system.overrides))
    if system.warm:
        data["init_from"] = str(_warm_start(system, seed, args, run_dir))
    data = {k: v for k, v in data.items() if k in names}
    return spec, config_from_dict(spec.config_cls, apply_overrides(spec.config_cls, data, args.set))


def _warm_start(system: System, seed: int, args: argparse.Namespace, run_dir: Path) -> Path:
    """The SFT run a warm system starts RL from: ``marft sft`` on the env's scripted demonstrations
    with the RL run's LoRA shape, once per (system, seed) inside the job's run dir (a re-run
    reuses a finished one). Demonstrations are not generated tokens: the budget counts RL only.

    Warm systems of one seed on one env share their SFT settings, and SFT is deterministic given
    them, so a finished SFT run of another job under the same ``--out`` with exactly the same
    ``marft sft`` settings (all but the run dir) is copied instead of trained again."""
    from marft_algos.cli import main as marft

    sft_dir = run_dir / "sft"
    done = sft_dir / "SFT_DONE"
    if not done.exists():
        # An SFT run a killed job left unfinished goes either way: `marft sft` wants a new or
        # empty run dir, and a copy is renamed into place.
        shutil.rmtree(sft_dir, ignore_errors=True)
        argv = _sft_argv(system, seed, args, sft_dir)
        twin = _sft_twin(run_dir.parent.parent, argv)
        if twin is not None:
            tmp = sft_dir.with_name("sft.copying")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(twin, tmp)
            (tmp / "COPIED_FROM").write_text(f"{twin}\n")
            tmp.rename(sft_dir)  # SFT_DONE came with the copy
            print(f"[equal-budget] {system.name} seed {seed}: SFT adapters copied from {twin} (the same `marft sft` settings)", flush=True)
            return sft_dir
        code = marft(argv)
        if code:
            raise SystemExit(f"{system.name} seed {seed}: `marft {' '.join(argv)}` failed (exit {code})")
        done.write_text("ok\n")
    return sft_dir


def _sft_argv(system: System, seed: int, args: argparse.Namespace, sft_dir: Path) -> list[str]:
    """The ``marft sft`` command line of a warm system's SFT run."""
    rl = {**QUICKSTART_RECIPE, **dict(kv.split("=", 1) for kv in args.set if "=" in kv)}
    argv = ["sft", "--env", _env_id(args, system.env), "--env-kwargs", json.dumps(_env_kwargs(system, args)), "--model", args.model,
            "--demos", "scripted", "--seed", str(seed), "--out", str(sft_dir),
            "--lora-r", str(rl["lora_r"]), "--lora-alpha", str(rl["lora_alpha"])]
    for kv in args.sft_set:  # KEY=VALUE -> --key VALUE (see `marft sft --help`)
        key, _, value = kv.partition("=")
        argv += ["--" + key.replace("_", "-"), value]
    return argv


def _sft_settings(argv: list[str]) -> dict[str, Any]:
    """The ``SFTConfig`` a ``marft sft`` command line gives, as in its ``sft.json``, without the run dir."""
    from marft_algos.cli import _sft_config
    from marft_algos.cli import build_parser as marft_parser

    settings = json.loads(json.dumps(dataclasses.asdict(_sft_config(marft_parser().parse_args(argv)))))
    settings.pop("out_dir", None)
    return settings


def _sft_twin(rundirs: Path, argv: list[str]) -> Path | None:
    """A finished SFT run under ``rundirs`` (``<system>/seed<k>/sft``) whose settings equal ``argv``'s."""
    want = _sft_settings(argv)
    for done in sorted(rundirs.glob("*/seed*/sft/SFT_DONE")):
        try:
            have = json.loads((done.parent / "sft.json").read_text())["config"]
        except (OSError, ValueError, KeyError):
            continue
        have.pop("out_dir", None)
        if have == want:
            return done.parent
    return None


def _step_record(m: dict[str, Any], tokens: int, minutes: float) -> dict[str, Any]:
    """The per-step metrics kept in a job's JSON (reward, tokens, per-agent grad norms, rollbacks, agent metrics,
    the KL to the reference and across the update, an actor-critic's mean advantage and value per agent, and the
    step's ``perf/`` timings: where its minutes went (rollout, update, KL diagnostics) and its torch thread count,
    which a resume with another ``--threads`` changes and the minutes depend on)."""
    keep = {k: float(v) for k, v in m.items() if isinstance(v, int | float) and (
        k.startswith(("team/", "recovery/", "perf/")) or k in ("rollout/tokens", "critic/grad_norm", "train/step")
        or (k.startswith("agent/") and k.rsplit("/", 1)[-1] in ("reward", "grad_norm", "response_len", "entropy", "kl", "length_stop_frac",
                                                                       "rollout_ref_kl", "update_kl", "ref_kl",
                                                                       "advantage_mean", "value_mean")))}
    keep["tokens_so_far"] = tokens
    keep["train_minutes"] = minutes
    return keep


def run_job(system: System, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run one (system, seed) job and return its record (the caller writes it)."""
    import torch

    torch.set_num_threads(args.threads)
    t_job, cpu_job = time.perf_counter(), time.process_time()
    env_id = _env_id(args, system.env)
    rec: dict[str, Any] = {"system": system.name, "seed": seed, "env_id": env_id, "env_kwargs": _env_kwargs(system, args),
                           "model": args.model, "algo": system.algo, "eval_n": args.eval_n, "token_budget": args.token_budget}
    if system.majority:
        rec.update(_majority(seed, args, _records_dir(args, out)))
    elif not system.trained:
        from benchmarks._common import untrained_policy

        policy = untrained_policy(_agents(env_id, rec["env_kwargs"]), args.model)
        rec["eval"] = _heldout(policy, env_id, rec["env_kwargs"], args)
        rec.update(train_tokens=0, steps=0, train_minutes=0.0, curve=[])
    else:
        rec.update(_train(system, seed, args, out, env_id, (t_job, cpu_job)))
    # a resumed job adds the time its earlier processes spent up to their last checkpoint (what the resume kept)
    rec["job_minutes"] = (time.perf_counter() - t_job) / 60 + rec.get("job_minutes_before_resume", 0.0)
    rec["job_cpu_minutes"] = (time.process_time() - cpu_job) / 60 + rec.get("job_cpu_minutes_before_resume", 0.0)  # on a shared CPU, wall clock overstates the cost
    rec["correct_per_problem"] = rec["eval"]["correct_per_problem"]
    rec["accuracy"] = float(np.mean(rec["correct_per_problem"])) if rec["correct_per_problem"] else float("nan")
    return rec


def _progress_path(run_dir: Path) -> Path:
    return run_dir / "progress.json"


def _resume(trainer: Any, run_dir: Path) -> dict[str, Any]:
    """The saved progress of an unfinished job (and its checkpoint loaded into ``trainer``), or a fresh start.

    ``progress.json`` is written after the checkpoint of the same step, so a job stopped at any
    point resumes from its last completed step: a checkpoint newer than the progress file is
    ignored in favour of the one the progress file names.
    """
    fresh = {"step": 0, "tokens": 0, "groups": 0, "spent": 0.0, "cpu": 0.0, "curve": [], "heldout_curve": []}
    path = _progress_path(run_dir)
    if not path.exists():
        return fresh
    prog = json.loads(path.read_text())
    ckpt = run_dir / "checkpoints" / f"step-{prog['step']:08d}"
    if not ckpt.exists():
        print(f"[equal-budget] {run_dir}: progress names step {prog['step']} but {ckpt} is gone; starting over", flush=True)
        return fresh
    trainer.load_checkpoint(ckpt)
    prog.setdefault("resumed_at", []).append(prog["step"])
    print(f"[equal-budget] resumed {run_dir} at step {prog['step']} ({prog['tokens']} tokens)", flush=True)
    return prog


def _save_progress(trainer: Any, run_dir: Path, prog: dict[str, Any]) -> None:
    trainer.save_checkpoint(run_dir / "checkpoints")
    tmp = _progress_path(run_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(prog, default=float))
    tmp.replace(_progress_path(run_dir))  # atomic, and only after the checkpoint it names exists


def _curve_due(before: int, after: int, every: int) -> bool:
    """True when the budget line crosses a multiple of ``every`` tokens between two steps."""
    return every > 0 and after // every > before // every


def _train(system: System, seed: int, args: argparse.Namespace, out: Path, env_id: str, started: tuple[float, float]) -> dict[str, Any]:
    """Train one job to the token budget, checkpointing every ``--checkpoint-every`` steps; the job's fields.

    ``started``: the job process's ``(perf_counter, process_time)`` at its start; each checkpoint's
    progress keeps the job's wall and CPU time so far, so a resumed job's minutes cover every process."""
    run_dir = out / "rundirs" / system.name / f"seed{seed}"
    env_kwargs = _env_kwargs(system, args)
    spec, config = _config(system, seed, args, run_dir, out)
    trainer = spec.trainer_cls(config)
    prog = _resume(trainer, run_dir)
    wall_before, cpu_before = prog.get("job_wall", 0.0), prog.get("job_cpu", 0.0)
    if system.warm and prog["step"] == 0 and "init_eval" not in prog:  # after SFT, before RL: splits warm - cold into what SFT and RL each did
        prog["init_eval"] = _init_eval(trainer.policy, env_id, env_kwargs, args)
        if args.curve_every_tokens:
            prog["heldout_curve"].insert(0, {"tokens": 0, **prog["init_eval"]["curve_point"]})
    full = config.num_envs // trainer.algorithm.group_size
    while "stopped" not in prog and prog["tokens"] < args.token_budget and trainer.global_step < args.max_steps:
        t0, c0 = time.perf_counter(), time.process_time()
        n = fit_groups(prog["tokens"], prog["groups"], args.token_budget, full)
        try:
            m = trainer.train_step(n)
        except CollapseError as e:  # the recipe's collapse guard gave up: the run ends on its last good weights
            m = {**e.metrics, "recovery/stopped": 1.0}
            prog["stopped"] = {"step": e.step, "reasons": e.reasons, "message": str(e)}
        before = prog["tokens"]
        prog["groups"] += n
        prog["spent"] += time.perf_counter() - t0
        prog["cpu"] += time.process_time() - c0
        prog["tokens"] += int(m.get("rollout/tokens", 0))
        prog["step"] = trainer.global_step
        prog["curve"].append(_step_record(m, prog["tokens"], prog["spent"] / 60))
        print(f"[equal-budget] {system.name} seed {seed} step {trainer.global_step}: reward {m.get('team/reward', float('nan')):.3f}, "
              f"{prog['tokens']}/{args.token_budget} tokens, {prog['spent'] / 60:.1f} min", flush=True)
        if _curve_due(before, prog["tokens"], args.curve_every_tokens) and prog["tokens"] < args.token_budget and "stopped" not in prog:
            ev = _heldout(trainer.policy, env_id, env_kwargs, args, n=args.curve_eval_n)
            prog["heldout_curve"].append({"tokens": prog["tokens"], "accuracy": ev["accuracy"], "n": ev["n"]})
        if "stopped" in prog:  # its tokens were generated and count; a re-run evaluates, never trains on
            prog["stopped"]["tokens"] = prog["tokens"]
            print(f"[equal-budget] {system.name} seed {seed} stopped: {prog['stopped']['message']}", flush=True)
        if "stopped" in prog or (args.checkpoint_every and trainer.global_step % args.checkpoint_every == 0):
            prog["job_wall"] = wall_before + time.perf_counter() - started[0]
            prog["job_cpu"] = cpu_before + time.process_time() - started[1]
            _save_progress(trainer, run_dir, prog)
    if trainer.logger is not None:
        trainer.logger.flush()
    rec: dict[str, Any] = dict(
        train_tokens=prog["tokens"], steps=trainer.global_step, train_groups=prog["groups"], train_minutes=prog["spent"] / 60,
        train_cpu_minutes=prog["cpu"] / 60, curve=prog["curve"], resumed_at=prog.get("resumed_at"),
        job_minutes_before_resume=wall_before / 60, job_cpu_minutes_before_resume=cpu_before / 60,
        config={k: v for k, v in config.to_dict().items() if k in CONFIG_KEPT})
    if "stopped" in prog:
        rec["stopped"] = prog["stopped"]
    rec["eval"] = _heldout(trainer.policy, env_id, env_kwargs, args)
    if args.curve_every_tokens:  # the final point, on the curve's own problem set
        ev = _on_curve_set(trainer.policy, env_id, env_kwargs, args, rec["eval"])
        prog["heldout_curve"].append({"tokens": prog["tokens"], "accuracy": ev["accuracy"], "n": ev["n"]})
    rec["heldout_curve"] = prog["heldout_curve"]
    if "init_eval" in prog:
        rec["init_eval"] = prog["init_eval"]
    return rec


def _on_curve_set(policy: Any, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, full: dict[str, Any]) -> dict[str, Any]:
    """The held-out result on the curve's problems: ``full`` (the --eval-n result) when it covers them, else a --curve-eval-n run."""
    return full if args.curve_eval_n >= args.eval_n else _heldout(policy, env_id, env_kwargs, args, n=args.curve_eval_n)


def _init_eval(policy: Any, env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A warm job's held-out accuracy on its SFT adapters (the RL run's step 0): the full set, and the curve's first point."""
    ev = _heldout(policy, env_id, env_kwargs, args)
    point = _on_curve_set(policy, env_id, env_kwargs, args, ev) if args.curve_every_tokens else ev
    return {"accuracy": ev["accuracy"], "n": ev["n"], "correct_per_problem": ev["correct_per_problem"], "tool_calls_per_problem": ev["tool_calls_per_problem"],
            "curve_point": {"accuracy": point["accuracy"], "n": point["n"]}}


def _majority(seed: int, args: argparse.Namespace, records: Path) -> dict[str, Any]:
    """solo maj@k at the untrained duo's inference tokens; k from the untrained jobs' tokens/episode."""
    from benchmarks._common import untrained_policy
    from marft_algos.evaluation import majority_vote, run_samples, summarize

    first = int(args.seeds.split(",")[0])  # the untrained (greedy) systems run once, as the first seed
    duo, solo = (json.loads(_job_path(records, n, first).read_text()) for n in ("untrained-duo", "untrained-solo"))
    ratio = duo["eval"]["mean_tokens"] / max(solo["eval"]["mean_tokens"], 1e-9)
    k = max(3, round(ratio))
    env_kwargs = json.loads(args.env_kwargs)
    agents = _agents(args.solo_env, env_kwargs)
    policy = untrained_policy(agents, args.model)
    (limit,) = {s["max_new_tokens"] for s in _sampling(args.solo_env, env_kwargs, args).values()}
    import marft_envs

    n = min(args.eval_n, marft_envs.make(args.solo_env, split="test", **env_kwargs).num_problems)  # the problems evaluate() plays
    recs = run_samples(policy, args.solo_env, split="test", env_kwargs=env_kwargs, problems=list(range(n)), k=k,
                       temperature=0.7, max_new_tokens=limit, num_envs=args.num_envs_eval, seed=1234 + 7919 * seed)
    votes = sorted(majority_vote(recs, budget=k, k=1), key=lambda r: r.problem)
    s = summarize(votes)
    ev = {"mean_tokens": s["tokens_per_episode"], "n": s["problems"], "accuracy": s["accuracy"],
          "correct_per_problem": [int(r.correct) for r in votes],
          "score_per_problem": [float(r.correct) if r.score is None else r.score for r in votes], "single_sample_accuracy": summarize(recs)["accuracy"]}
    return {"k": k, "token_ratio": ratio, "eval": ev, "train_tokens": 0, "steps": 0, "train_minutes": 0.0, "curve": []}


# --------------------------------------------------------------------------------------
# the queue
# --------------------------------------------------------------------------------------


def _records_dir(args: argparse.Namespace, out: Path) -> Path:
    """Where the jobs' result JSONs live: ``--records``, else ``<out>/runs`` (checkpoints and logs stay in ``--out``)."""
    return Path(args.records) if args.records else out / "runs"


def _job_path(records: Path, system: str, seed: int) -> Path:
    return records / system / f"seed{seed}.json"


def _pid_path(out: Path, system: str, seed: int) -> Path:
    return out / "pids" / system / f"seed{seed}.pid"


def queue(seeds: Sequence[int], systems: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """The job order: untrained systems and maj@k, then tier by tier (core, credit, MALT/ReMA) seed by seed the trained systems.

    Untrained systems are greedy (one job, seed 0); maj@k samples, one job per seed.
    """
    chosen = [s for s in SYSTEMS if systems is None or s.name in systems]
    jobs = [(s.name, seeds[0]) for s in chosen if not s.trained and not s.majority]
    jobs += [(s.name, k) for s in chosen if s.majority for k in seeds]
    for tier in sorted({s.tier for s in chosen}):
        jobs += [(s.name, k) for k in seeds for s in chosen if s.trained and s.tier == tier]
    return jobs


def _deps(system: str, seeds: Sequence[int]) -> list[tuple[str, int]]:
    return [("untrained-duo", seeds[0]), ("untrained-solo", seeds[0])] if BY_NAME[system].majority else []


def _job_argv(argv: Sequence[str], system: str, seed: int) -> list[str]:
    rest, skip = [], False
    for a in argv:  # the job gets the same settings, minus the scheduler's own flags
        if skip:
            skip = False
            continue
        if a in ("--jobs", "--systems"):
            skip = True
            continue
        if a.startswith(("--jobs=", "--systems=")):
            continue
        rest.append(a)
    return [sys.executable, str(Path(__file__).resolve()), *rest, "--job", f"{system}:{seed}"]


def _write_job(records: Path, name: str, seed: int, rec: dict[str, Any]) -> None:
    path = _job_path(records, name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, default=float))
    tmp.replace(path)  # atomic: a JSON that exists is complete
    print(f"[equal-budget] {name} seed {seed}: accuracy {rec['accuracy']:.3f}, {rec['train_tokens']} tokens, "
          f"{rec['steps']} steps, {rec['job_minutes']:.1f} min", flush=True)


def _live_pid(out: Path, system: str, seed: int) -> int | None:
    """The pid of a live process running job (system, seed) per its pid file, or None."""
    f = _pid_path(out, system, seed)
    try:
        pid = int(f.read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if f"{system}:{seed}" in cmd else None


def run_queue(args: argparse.Namespace, argv: Sequence[str], out: Path) -> None:
    """Run the pending jobs, ``--jobs`` at a time, each a subprocess with one thread; log to ``<out>/logs``."""
    seeds = [int(s) for s in args.seeds.split(",")]
    records = _records_dir(args, out)
    pending = [j for j in queue(seeds, _systems(args)) if not _job_path(records, *j).exists()]
    if args.jobs == 0:  # in this process, one after the other (tests)
        for name, seed in pending:
            if all(_job_path(records, *d).exists() for d in _deps(name, seeds)):
                _write_job(records, name, seed, run_job(BY_NAME[name], seed, args, out))
        return
    running: dict[tuple[str, int], tuple[subprocess.Popen | int, float, Any]] = {}
    for job in list(pending):  # a job still running from a stopped scheduler is adopted, not started twice
        pid = _live_pid(out, *job)
        if pid is not None:
            pending.remove(job)
            running[job] = (pid, time.time(), None)
            print(f"[equal-budget] adopted running {job[0]} seed {job[1]} (pid {pid})", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    failed: set[tuple[str, int]] = set()
    while pending or running:
        for job, (proc, t0, log) in list(running.items()):
            if (proc.poll() is None) if isinstance(proc, subprocess.Popen) else (_live_pid(out, *job) is not None):
                continue  # still running
            if log is not None:
                log.close()
            del running[job]
            code = proc.returncode if isinstance(proc, subprocess.Popen) else 0
            ok = code == 0 and _job_path(records, *job).exists()
            print(f"[equal-budget] {'done' if ok else 'FAILED'} {job[0]} seed {job[1]} in {(time.time() - t0) / 60:.1f} min"
                  + ("" if ok else f" (exit {code}; see {out}/logs/{job[0]}/seed{job[1]}.log)"), flush=True)
            if not ok:
                failed.add(job)
        for job in list(pending):
            if len(running) >= args.jobs:
                break
            deps = _deps(job[0], seeds)
            if any(d in failed for d in deps):
                pending.remove(job)
                failed.add(job)
                continue
            if not all(_job_path(records, *d).exists() for d in deps):
                continue
            pending.remove(job)
            logp = out / "logs" / job[0] / f"seed{job[1]}.log"
            logp.parent.mkdir(parents=True, exist_ok=True)
            log = logp.open("a")
            print(f"[equal-budget] start {job[0]} seed {job[1]}", flush=True)
            proc = subprocess.Popen(_job_argv(argv, *job), stdout=log, stderr=subprocess.STDOUT, env=env)
            _pid_path(out, *job).parent.mkdir(parents=True, exist_ok=True)
            _pid_path(out, *job).write_text(str(proc.pid))
            running[job] = (proc, time.time(), log)
        if running:
            time.sleep(2)
        elif pending:  # nothing can start: the dependencies failed or are not in the selection
            print(f"[equal-budget] cannot start {pending}: their dependencies have no result", flush=True)
            break


def job_status(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Where each job of the selection stands, read from disk (nothing runs): ``done`` (its record),
    ``running`` (a live job process per its pid file), ``partial`` (a checkpointed, unfinished job:
    a re-run continues it), ``stopped`` (the collapse guard ended it; a re-run evaluates it) or
    ``pending``. ``cpu_left`` estimates the CPU minutes still to spend: an unfinished job at its own
    CPU minutes per token so far (a linear guess: replies that shrink make later tokens dearer),
    a pending one at the median of the system's recorded jobs (None without one)."""
    seeds = [int(s) for s in args.seeds.split(",")]
    records = _records_dir(args, out)
    runs = _load(records)  # every record once, those of seeds outside the selection too (the pending jobs' medians)
    rows = []
    for name, seed in queue(seeds, _systems(args)):
        row: dict[str, Any] = {"system": name, "seed": seed, "state": "pending", "step": None, "tokens": None, "cpu_minutes": None, "cpu_left": None}
        path = _job_path(records, name, seed)
        if path.exists():
            rec = json.loads(path.read_text())
            row.update(state="done", step=rec.get("steps"), tokens=rec.get("train_tokens"), cpu_minutes=rec.get("job_cpu_minutes"), cpu_left=0.0,
                       accuracy=rec.get("accuracy"))
            rows.append(row)
            continue
        prog_path = _progress_path(out / "rundirs" / name / f"seed{seed}")
        if prog_path.exists():
            prog = json.loads(prog_path.read_text())
            cpu = prog.get("job_cpu", prog.get("cpu", 0.0)) / 60
            row.update(state="stopped" if "stopped" in prog else "partial", step=prog["step"], tokens=prog["tokens"], cpu_minutes=cpu)
            if "stopped" not in prog and prog["tokens"] > 0:
                row["cpu_left"] = cpu * max(args.token_budget - prog["tokens"], 0) / prog["tokens"]
        if _live_pid(out, name, seed) is not None:
            row["state"] = "running"
        if row["cpu_left"] is None and row["state"] != "stopped":
            done = [r["job_cpu_minutes"] for r in runs[name] if r.get("job_cpu_minutes") is not None]
            if done and row["tokens"] is None:
                row["cpu_left"] = float(np.median(done))
        rows.append(row)
    return rows


def status_table(rows: Sequence[dict[str, Any]], budget: int) -> str:
    """:func:`job_status` as markdown, with a closing line of totals."""
    def fmt(x: float | None, spec: str, none: str = "") -> str:
        return none if x is None else format(x, spec)

    shown = [{"system": r["system"], "seed": r["seed"], "state": r["state"], "step": fmt(r["step"], "d"),
              "tokens": fmt(r["tokens"], "d") + ("" if r["tokens"] is None else f"/{budget}"),
              "cpu_minutes": fmt(r["cpu_minutes"], ".1f"), "cpu_left": fmt(r["cpu_left"], ".1f", "?") if r["state"] != "done" else "",
              "accuracy": fmt(r.get("accuracy"), ".3f")} for r in rows]
    cols = ["system", "seed", "state", "step", "tokens", "cpu_minutes", "cpu_left", "accuracy"]
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "running", "partial", "stopped", "pending")}
    known = [r["cpu_left"] for r in rows if r["cpu_left"] is not None]
    unknown = sum(r["cpu_left"] is None and r["state"] != "stopped" for r in rows)
    total = (f"{len(rows)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
             + f"; about {sum(known) / 60:.1f} CPU hours left" + (f" (+ {unknown} jobs with no estimate)" if unknown else ""))
    return markdown_table(shown, cols) + "\n\n" + total


def _systems(args: argparse.Namespace) -> list[str] | None:
    if not args.systems:
        return None
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown --systems {unknown}; known: {list(BY_NAME)}")
    return names


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------


def _load(records: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for s in SYSTEMS:
        d = records / s.name
        runs[s.name] = [json.loads(p.read_text()) for p in sorted(d.glob("seed*.json"))] if d.exists() else []
    return runs


def _row(s: System, recs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    if not recs:
        return {"system": s.name, "env_id": _env_id(args, s.env), "status": "not run"}
    accs = [r["accuracy"] for r in recs]
    pooled = [c for r in recs for c in r["correct_per_problem"]]
    p = float(np.mean(pooled))
    lo, hi = wilson(p, len(pooled))
    name = s.name + (f" (k={recs[0]['k']})" if s.majority else "")
    return {
        "system": name, "env_id": recs[0]["env_id"], "seeds": ",".join(str(r["seed"]) for r in recs),
        "mean_accuracy": float(np.mean(accs)), "seed_accuracies": " ".join(f"{a:.3f}" for a in accs),
        "pooled_ci": f"[{lo:.3f}, {hi:.3f}]", "problems": len(recs[0]["correct_per_problem"]),
        "train_tokens": " ".join(str(r["train_tokens"]) for r in recs), "steps": " ".join(str(r["steps"]) for r in recs),
        "train_minutes": " ".join(f"{r['train_minutes']:.1f}" for r in recs), "job_minutes": " ".join(f"{r['job_minutes']:.1f}" for r in recs),
        "job_cpu_minutes": " ".join(f"{r.get('job_cpu_minutes', float('nan')):.1f}" for r in recs),
        "eval_tokens_per_episode": float(np.mean([r["eval"]["mean_tokens"] for r in recs])),
        # prompt tokens the agents read (jobs written before it was recorded: nan)
        "eval_prompt_tokens_per_episode": float(np.mean([r["eval"].get("mean_prompt_tokens", float("nan")) for r in recs])),
        "tool_call_rate": _tool_rate([r["eval"] for r in recs]), "status": _status(recs),
    }


def _status(recs: Sequence[dict[str, Any]]) -> str:
    """"ok", or the seeds the collapse guard stopped before the budget (at how many tokens)."""
    stopped = [f"seed {r['seed']} at {r['stopped']['tokens']} tokens" for r in recs if "stopped" in r]
    return "ok" if not stopped else "collapse guard stopped " + ", ".join(stopped)


def _tool_rate(evals: Sequence[dict[str, Any]]) -> str:
    """Held-out episodes with at least one tool call, pooled over ``evals``, with its Wilson interval ("" when not recorded)."""
    calls = [c for e in evals for c in e.get("tool_calls_per_problem", ())]
    if not calls or len(calls) < sum(len(e["correct_per_problem"]) for e in evals):  # some job predates the record
        return ""
    p = float(np.mean([c > 0 for c in calls]))
    lo, hi = wilson(p, len(calls))
    return f"{p:.2f} [{lo:.2f}, {hi:.2f}]"


def tokens_to_target(curve: Sequence[dict[str, Any]], target: float) -> float:
    """Generated training tokens at the first held-out point with accuracy >= ``target`` (inf: never)."""
    return next((float(p["tokens"]) for p in curve if p["accuracy"] >= target - 1e-12), float("inf"))


def _target(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> float:
    """``--target``, or the untrained solo agent's accuracy on the curve's problems."""
    if args.target > 0:
        return args.target
    solo = runs.get("untrained-solo") or []
    return float(np.mean(solo[0]["correct_per_problem"][: args.curve_eval_n])) if solo else float("nan")


def _efficiency_report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """The report's tokens-to-target section and its rows; a default target that every curve meets
    (the untrained solo agent scores 0, as on RAG) or that is unknown is named instead of tabulated."""
    rows = _efficiency(runs, target := _target(runs, args))
    if not rows:  # no trained run with a held-out curve
        return "", []
    head = (f"\n## Sample efficiency: generated training tokens until held-out accuracy (first {args.curve_eval_n} test problems, "
            f"greedy, every {args.curve_every_tokens} tokens) first reaches the target\n\n")
    if not target > 0:  # 0 or nan
        why = "scores 0 on them, so every curve point meets its accuracy" if target == 0 else "has no record"
        return head + f"No target: the untrained solo agent {why}; pass `--target` (a held-out accuracy) for this table.\n", []
    return head + markdown_table(rows, ["system", "target", "seeds", "tokens_to_target", "median", "reached", "final_curve_accuracy"]) + "\n", rows


def _efficiency(runs: dict[str, list[dict[str, Any]]], target: float) -> list[dict[str, Any]]:
    """Per trained system with held-out curves: tokens-to-target per seed and their median."""
    rows = []
    for s in SYSTEMS:
        recs = [r for r in runs.get(s.name, []) if r.get("heldout_curve")]
        if not s.trained or not recs:
            continue
        ttt = [tokens_to_target(r["heldout_curve"], target) for r in recs]
        rows.append({"system": s.name, "target": f"{target:.3f}", "seeds": ",".join(str(r["seed"]) for r in recs),
                     "tokens_to_target": " ".join("never" if t == float("inf") else str(int(t)) for t in ttt),
                     "median": "never" if np.median(ttt) == float("inf") else int(np.median(ttt)),
                     "reached": f"{sum(t < float('inf') for t in ttt)}/{len(ttt)}",
                     "final_curve_accuracy": " ".join(f"{r['heldout_curve'][-1]['accuracy']:.3f}" for r in recs)})
    return rows


def _scores(rec: dict[str, Any]) -> list[float]:
    """A job's per-problem grader scores (jobs written before they were recorded: the 0/1 correctness)."""
    return rec["eval"].get("score_per_problem", rec["correct_per_problem"])


def _graded_beyond_correctness(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """True when some job's grader scores are not its 0/1 correctness (e.g. RAG's answer F1)."""
    return any(_scores(r) != [float(c) for c in r["correct_per_problem"]] for rs in runs.values() for r in rs)


def _diffs(runs: dict[str, list[dict[str, Any]]], reps: int, per_problem: Any = None) -> list[dict[str, Any]]:
    """Paired differences of :data:`COMPARISONS` on ``per_problem(job)`` (default: 0/1 correctness)."""
    per_problem = per_problem or (lambda r: r["correct_per_problem"])
    rows = []
    for a, b in COMPARISONS:
        ra, rb = runs.get(a, []), runs.get(b, [])
        if not ra or not rb:
            rows.append({"a": a, "b": b, "significant": "not run"})
            continue
        d = paired_bootstrap(np.array([per_problem(r) for r in ra]), np.array([per_problem(r) for r in rb]), reps=reps)
        rows.append({"a": a, "b": b, **d, "significant": "yes" if _significant(d) else "no", "seeds_a": len(ra), "seeds_b": len(rb)})
    return rows


def _seed_pairs(ra: list[dict[str, Any]], rb: list[dict[str, Any]], b: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A's records paired with B's of the same seed; a greedy untrained B (recorded once) pairs with every seed of A."""
    by_seed = {r["seed"]: r for r in rb}
    once = rb[0] if len(rb) == 1 and not BY_NAME[b].trained and not BY_NAME[b].majority else None
    return [(x, by_seed.get(x["seed"], once)) for x in ra if x["seed"] in by_seed or once is not None]


def _per_seed_diffs(runs: dict[str, list[dict[str, Any]]], reps: int) -> list[dict[str, Any]]:
    """:data:`COMPARISONS` one training seed at a time: is a pooled difference carried by every seed, or by one?

    Only the comparisons where a side has several seeds (otherwise the row equals the pooled one).
    """
    rows = []
    for a, b in COMPARISONS:
        ra, rb = runs.get(a, []), runs.get(b, [])
        if len(ra) < 2 and len(rb) < 2:
            continue
        for x, y in _seed_pairs(ra, rb, b):
            d = paired_bootstrap(np.array([x["correct_per_problem"]]), np.array([y["correct_per_problem"]]), reps=reps)
            rows.append({"a": a, "b": b, "seed_a": x["seed"], "seed_b": y["seed"], **d, "significant": "yes" if _significant(d) else "no"})
    return rows


def _warm_starts(runs: dict[str, list[dict[str, Any]]], reps: int) -> list[dict[str, Any]]:
    """Per warm system: held-out accuracy on its SFT adapters and after RL, and the paired RL - SFT difference."""
    rows = []
    for s in SYSTEMS:
        recs = [r for r in runs.get(s.name, []) if s.warm and "init_eval" in r]
        if not recs:
            continue
        sft = np.array([r["init_eval"]["correct_per_problem"] for r in recs])
        rl = np.array([r["correct_per_problem"] for r in recs])
        row = {"system": s.name, "seeds": ",".join(str(r["seed"]) for r in recs), "after_sft": float(sft.mean()), "after_sft_rl": float(rl.mean()),
               "rl_minus_sft": _interval(paired_bootstrap(rl, sft, reps=reps)),
               "tool_rate_sft": _tool_rate([r["init_eval"] for r in recs]), "tool_rate_sft_rl": _tool_rate([r["eval"] for r in recs])}
        untrained = runs.get(f"untrained-{s.env}") or []
        if untrained:
            row["sft_minus_untrained"] = _interval(paired_bootstrap(sft, np.array([r["correct_per_problem"] for r in untrained]), reps=reps))
        rows.append(row)
    return rows


def _significant(d: dict[str, float]) -> bool:
    """A paired difference whose interval excludes 0."""
    return d["ci_low"] > 0 or d["ci_high"] < 0


def _interval(d: dict[str, float]) -> str:
    """``+0.020 [-0.030, +0.080]``, starred when the interval excludes 0."""
    star = " *" if _significant(d) else ""
    return f"{d['difference']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]{star}"


def _stability(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for s in SYSTEMS:
        if not s.trained or not runs.get(s.name):
            continue
        spikes, jumps, steps, rollbacks, peak = 0, 0, 0, 0, 0.0
        for r in runs[s.name]:
            agents = sorted({k.split("/")[1] for st in r["curve"] for k in st if k.startswith("agent/") and k.endswith("/grad_norm")})
            for a in agents:
                norms = [st.get(f"agent/{a}/grad_norm", float("nan")) for st in r["curve"]]
                spikes += grad_spikes(norms)
                jumps += grad_jumps(norms)
                peak = max([peak, *[x for x in norms if x == x]])
            steps += len(r["curve"])
            rollbacks += int(sum(st.get("recovery/rollback", 0.0) for st in r["curve"]))
        rows.append({"system": s.name, "seeds": len(runs[s.name]), "steps": steps, "grad_spikes": spikes, "grad_jumps": jumps, "max_grad_norm": peak, "rollbacks": rollbacks})
    return rows


def _curve_agents(recs: list[dict[str, Any]]) -> list[str]:
    """The agents named in the first step of the runs' per-step curves (``agent/<name>/...``)."""
    return sorted({k.split("/")[1] for r in recs for k in r["curve"][0] if k.startswith("agent/")})


def _per_agent(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Which agent moved: each agent's training metrics, first step vs last step, mean over seeds; eval tokens vs untrained."""
    base = {r["system"]: r for n in ("untrained-solo", "untrained-duo") for r in (runs.get(n) or [])[:1]}
    rows = []
    for s in SYSTEMS:
        if not s.trained or not runs.get(s.name):
            continue
        recs = [r for r in runs[s.name] if r["curve"]]
        for a in _curve_agents(recs):
            row: dict[str, Any] = {"system": s.name, "agent": a}
            # not "kl": that is the KL to the rollout policy, ~0 with one PPO epoch by construction;
            # rollout_ref_kl (KL to the reference, measured before each update) only in jobs that recorded it
            for m in ("reward", "response_len", "entropy", "grad_norm", "rollout_ref_kl"):
                first = [r["curve"][0].get(f"agent/{a}/{m}") for r in recs]
                last = [r["curve"][-1].get(f"agent/{a}/{m}") for r in recs]
                if None not in first and None not in last:
                    row[f"{m} first->last"] = f"{np.mean(first):.3g} -> {np.mean(last):.3g}"
            toks = [r["eval"].get("per_agent_tokens", {}).get(a) for r in recs]
            ref = {"solo": "untrained-solo", "duo": "untrained-duo"}.get(s.env, "")
            ub = base.get(ref, {}).get("eval", {}).get("per_agent_tokens", {}).get(a)
            if None not in toks:
                row["eval tokens (untrained)"] = f"{np.mean(toks):.1f}" + (f" ({ub:.1f})" if ub is not None else "")
            rows.append(row)
    return rows


def _length_stops(runs: dict[str, list[dict[str, Any]]], k: int = 3) -> list[dict[str, Any]]:
    """Each agent's share of actions cut by ``max_new_tokens``, mean of its first ``k`` and last
    ``k`` training steps, seed by seed: a reply running to its token limit (a format collapse the
    team reward may never show) stands out per seed where a mean over seeds would blur it."""
    rows = []
    for s in SYSTEMS:
        recs = [r for r in runs.get(s.name) or [] if r.get("curve")]
        if not s.trained or not recs:
            continue
        for a in _curve_agents(recs):
            cells = []
            for r in recs:
                share = [st.get(f"agent/{a}/length_stop_frac") for st in r["curve"]]
                share = [x for x in share if x is not None]
                if share:
                    cells.append(f"seed {r['seed']}: {np.mean(share[:k]):.2f} -> {np.mean(share[-k:]):.2f}")
            if cells:
                rows.append({"system": s.name, "agent": a, "first -> last": "; ".join(cells)})
    return rows


def _plot(out: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = any(r.get("heldout_curve") for rs in runs.values() for r in rs)
    fig, axes = plt.subplots(1, 3 if curves else 2, figsize=(18 if curves else 12, 4.2))
    a1, a2 = axes[0], axes[1]
    colors = {}
    for i, s in enumerate(SYSTEMS):
        colors[s.name] = plt.cm.tab20(i % 20)
        for j, r in enumerate(runs.get(s.name, [])):
            if r["curve"]:
                a1.plot([st["tokens_so_far"] for st in r["curve"]],  # the budget's unit: steps differ in size across systems
                        [st.get("team/reward", float("nan")) for st in r["curve"]], "o-", ms=3, alpha=0.8, color=colors[s.name],
                        label=s.name if j == 0 else None)
    a1.set_xlabel("generated training tokens")
    a1.set_ylabel("team reward (training batch)")
    a1.set_title("learning curves (one line per seed)")
    if a1.get_legend_handles_labels()[0]:  # untrained systems only: no curve to label
        a1.legend(fontsize=7)
    names = [s.name for s in SYSTEMS]
    for x, n in enumerate(names):
        accs = [r["accuracy"] for r in runs.get(n, [])]
        if accs:
            a2.scatter([x] * len(accs), accs, color=colors[n], s=18, zorder=3)
            a2.hlines(np.mean(accs), x - 0.3, x + 0.3, color="k")
        else:
            a2.text(x, 0.02, "not run", rotation=90, fontsize=7, ha="center")
    a2.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
    a2.set_ylabel("held-out accuracy (greedy)")
    a2.set_ylim(0, 1)
    a2.set_title("final accuracy (dots: seeds, bar: mean)")
    if curves:  # held-out accuracy against generated training tokens: the sample-efficiency view
        a3 = axes[2]
        for s in SYSTEMS:
            for j, r in enumerate(runs.get(s.name, [])):
                pts = r.get("heldout_curve") or []
                if pts:
                    a3.plot([p["tokens"] for p in pts], [p["accuracy"] for p in pts], "o-", ms=3, alpha=0.8,
                            color=colors[s.name], label=s.name if j == 0 else None)
        a3.set_xlabel("generated training tokens")
        a3.set_ylabel("held-out accuracy (curve problems, greedy)")
        a3.set_ylim(0, 1)
        a3.set_title("held-out accuracy during training")
        a3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "equal_budget.png", dpi=110)
    plt.close(fig)


def report(args: argparse.Namespace, out: Path, command: str) -> str:
    """Write ``equal_budget.md/.csv/.json/.png`` from the jobs' JSONs; returns the Markdown."""
    runs = _load(_records_dir(args, out))
    rows = [_row(s, runs[s.name], args) for s in SYSTEMS]
    diffs = _diffs(runs, args.bootstrap)
    stab = _stability(runs)
    agents = _per_agent(runs)
    meta = versions()
    budgets = sorted({r.get("token_budget", args.token_budget) for rs in runs.values() for r in rs if r.get("algo")})
    budget = " / ".join(map(str, budgets)) if budgets else str(args.token_budget)  # as recorded by the runs
    n_problems = max((len(r["correct_per_problem"]) for rs in runs.values() for r in rs), default=args.eval_n)
    agent_cols = ["system", "agent", *sorted({k for r in agents for k in r} - {"system", "agent"})]
    text = (
        "# Equal-budget baselines\n\n"
        f"`{command}`\n\n"
        f"model `{args.model}`, envs solo `{args.solo_env}` / duo `{args.duo_env}` / MALT `{args.malt_env}` / ReMA `{args.rema_env}` "
        f"with env kwargs `{args.env_kwargs}`; training budget {budget} generated tokens per trained run (the last step collects "
        f"only the groups the rest of the budget buys: see train_tokens); held-out: test problems 0..{n_problems - 1} (the first --eval-n {args.eval_n}, or the whole "
        f"split when smaller), greedy; seeds {args.seeds}; "
        f"bootstrap {args.bootstrap} replicates; versions: " + ", ".join(f"{k} {v}" for k, v in meta.items()) + "\n\n"
        + markdown_table(rows, TABLE_COLUMNS)
        + "\n\n## Paired differences (A - B, mean over seeds; 95% paired bootstrap interval)\n\n"
        + markdown_table(diffs, DIFF_COLUMNS)
        + "\n\n## Stability (per agent: gradient-norm spikes, steps above 3x the run's median norm, which a norm decaying to ~0"
        " turns into spikes; jumps, steps above 3x the median of the 5 non-zero norms before them; collapse-recovery rollbacks)\n\n"
        + markdown_table(stab, ["system", "seeds", "steps", "grad_spikes", "grad_jumps", "max_grad_norm", "rollbacks"])
        + "\n\n## Per-agent view (training metrics, first step -> last step, mean over seeds)\n\n"
        + (markdown_table(agents, agent_cols) if agents else "no trained run yet") + "\n"
    )
    per_seed = _per_seed_diffs(runs, args.bootstrap)
    if per_seed:
        text += ("\n## Paired differences per seed (seed k of A - seed k of B; an untrained greedy B, recorded once, against every seed of A)\n\n"
                 + markdown_table(per_seed, PER_SEED_COLUMNS) + "\n")
    section, efficiency = _efficiency_report(runs, args)
    text += section
    cut = _length_stops(runs)
    if cut:
        text += ("\n## Length stops: each agent's share of actions cut by its max_new_tokens, mean of the first 3 and the last 3 training steps, per seed\n\n"
                 + markdown_table(cut, ["system", "agent", "first -> last"]) + "\n")
    warm = _warm_starts(runs, args.bootstrap)
    if warm:
        text += ("\n## Warm starts: held-out accuracy on the SFT adapters (before RL) and after RL; paired differences with their 95% bootstrap intervals (* : the interval excludes 0)\n\n"
                 + markdown_table(warm, ["system", "seeds", "after_sft", "sft_minus_untrained", "after_sft_rl", "rl_minus_sft", "tool_rate_sft", "tool_rate_sft_rl"]) + "\n")
    score_diffs = _diffs(runs, args.bootstrap, _scores) if _graded_beyond_correctness(runs) else []
    if score_diffs:  # e.g. RAG, where exact match is near 0 and answer F1 carries the signal
        means = [{"system": s.name, "mean_score": float(np.mean([np.mean(_scores(r)) for r in runs[s.name]]))} for s in SYSTEMS if runs[s.name]]
        text += ("\n## The grader's score (e.g. answer F1; maj@k: the voted sample's score): means and paired differences\n\n"
                 + markdown_table(means, ["system", "mean_score"]) + "\n\n" + markdown_table(score_diffs, DIFF_COLUMNS) + "\n")
    (out / "equal_budget.md").write_text(text)
    write_csv(out / "equal_budget.csv", rows, TABLE_COLUMNS)
    write_json(out / "equal_budget.json", {"systems": rows, "differences": diffs, "score_differences": score_diffs, "stability": stab, "per_agent": agents, "efficiency": efficiency, "warm_starts": warm, "per_seed_differences": per_seed, "length_stops": cut,
                                           "versions": meta, "settings": {k: v for k, v in vars(args).items() if k != "job"}})
    _plot(out, runs)
    return text


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``benchmarks/equal_budget.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--solo-env", default="arith-solo-v0")
    p.add_argument("--duo-env", default="arith-duo-v0")
    p.add_argument("--malt-env", default="arith-malt-v0")
    p.add_argument("--rema-env", default="arith-rema-v0")
    p.add_argument("--env-kwargs", default=json.dumps(QUICKSTART_ARITH_LEVEL),
                   help="JSON env kwargs of every env; default the quickstart's easy arith level; '{}' = the default level")
    p.add_argument("--token-budget", type=int, default=7000, help="generated training tokens per trained run (~6 duo steps)")
    p.add_argument("--max-steps", type=int, default=10_000, help="safety cap on training steps")
    p.add_argument("--group-size", type=int, default=4, help="GRPO group size")
    p.add_argument("--max-new-tokens", type=int, default=0, help=f"every agent's token limit (0: the quickstart's per role, at least {TOOL_ROLE_MIN_TOKENS} for a role with tools)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--eval-n", type=int, default=200, help="held-out problems (test indices 0..n-1)")
    p.add_argument("--num-envs-eval", type=int, default=32)
    p.add_argument("--bootstrap", type=int, default=10_000, help="bootstrap replicates")
    p.add_argument("--jobs", type=int, default=1, help="jobs run at once (subprocesses); 0: one after the other in this process")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads per job")
    p.add_argument("--systems", default="", help="comma-separated subset of systems (default all): " + ",".join(BY_NAME))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override of every trained system")
    p.add_argument("--checkpoint-every", type=int, default=1,
                   help="checkpoint a trained job every N steps (0: never); a re-run continues an unfinished job from its last one")
    p.add_argument("--curve-every-tokens", type=int, default=0,
                   help="held-out accuracy every N generated training tokens (0: off): the tokens-to-target table")
    p.add_argument("--curve-eval-n", type=int, default=50, help="held-out problems of each curve point (test indices 0..n-1)")
    p.add_argument("--target", type=float, default=0.0,
                   help="tokens-to-target level: held-out accuracy a run must reach (0: the untrained solo agent's accuracy; where that is 0, as on RAG, every run meets it and the report asks for a --target)")
    p.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE", help="`marft sft` option of the warm systems, e.g. epochs=2 (see `marft sft --help`)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the jobs' JSONs (pass the run's flags)")
    p.add_argument("--status", action="store_true",
                   help="print where each job stands (done, running, partial, stopped, pending) and an estimate of the CPU hours left; runs nothing")
    p.add_argument("--records", default="",
                   help="folder of the jobs' result JSONs (default <out>/runs): small enough to keep under version control, "
                        "so a report can pool seeds run on other machines; checkpoints and logs stay in --out")
    p.add_argument("--job", default="", help=argparse.SUPPRESS)  # SYSTEM:SEED, run by the queue
    p.add_argument("--out", default="runs/equal_budget")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pending jobs (or one ``--job``), then write the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    json_option("--env-kwargs", args.env_kwargs, '{"hops": [1], "k": 3}')
    out = Path(args.out)
    if args.status:
        print(status_table(job_status(args, out), args.token_budget))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if args.job:
        name, seed = args.job.rsplit(":", 1)
        _write_job(_records_dir(args, out), name, int(seed), run_job(BY_NAME[name], int(seed), args, out))
        return 0
    if not args.report_only:
        run_queue(args, argv, out)
    print(report(args, out, " ".join(["python", "benchmarks/equal_budget.py", *argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
