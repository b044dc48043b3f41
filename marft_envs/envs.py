"""Built-in environment ids, registered when ``marft_envs`` is imported.

Every id is a :class:`~marft_envs.text_env.TextTeamEnv` (see its docstring for
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
=====================  =======================================  =====================
"""

from __future__ import annotations

from marft_envs.registration import register

__all__ = ["BUILTIN_ENV_IDS", "FAMILIES", "register_builtin_envs"]

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
}

BUILTIN_ENV_IDS: tuple[str, ...] = tuple(
    f"{task}-{team}-v0" for task, (_, teams, _) in _TASKS.items() for team in teams
) + ("echo-duo-v0",)


def register_builtin_envs() -> None:
    """Register the built-in ids (done once on import; a second call overrides them, with a warning)."""
    for task, (what, teams, kwargs) in _TASKS.items():
        for team in teams:
            register(
                f"{task}-{team}-v0",
                _ENTRY,
                kwargs={"task": task, "profiles": team, **kwargs},
                description=f"{what}; {_TEAMS[team]}",
            )
    register(
        "echo-duo-v0",
        _ENTRY,
        kwargs={"task": "echo", "profiles": "echo"},
        description="toy: listener repeats the speaker's word (optimum 1, chance 1/4)",
    )


register_builtin_envs()


# ======================================================================================
# Tool-using and RAG teams (issue 16; marft_envs/tools, marft_envs/tasks/rag.py).
# Appended as one block so that merges with other edits of this file stay trivial.
# ======================================================================================
#: Ids registered by this block.
TOOL_ENV_IDS: tuple[str, ...] = ("arith-calc-duo-v0", "gsm8k-calc-duo-v0", "rag-solo-v0", "rag-quartet-v0")
_RAG_TASK = "marft_envs.tasks.rag:RAGTask"
# RAG: reward = answer F1 (EM is `correct`), minus small costs for tokens and tool use.
_RAG_REWARD = {"outcome": 0.0, "partial": 1.0, "cost_per_token": 0.0001}
_RAG_TOOLS = {"budget": 2, "reward": {"cost_per_tool_call": 0.01, "cost_per_tool_error": 0.05}}
_CALC_TOOLS = {"expected_tools": ["calculator"], "reward": {"cost_per_tool_error": 0.05}}

FAMILIES["rag"] = _page(
    "Retrieval-augmented QA (MMOA-RAG): a query rewriter, a document selector, a filter and an "
    "answer generator share the answer-F1 reward. Offline by default (``dataset='kb'``: a "
    "procedural multi-hop knowledge base with look-alike distractors); ``dataset='hotpotqa'`` or "
    "``'nq'`` for real data. The ``search`` tool (BM25 over the corpus) is available to the "
    "selector (quartet) and the generator (solo). See :mod:`marft_envs.tasks.rag` and the RAG page.",
    agents="solo: ``generator``; quartet: ``rewriter``, ``selector``, ``filter``, ``generator``",
    topology="``Chain`` (each agent sees the previous one; documents are passed on by id)",
).replace(
    "shared team reward: ``outcome * correct`` (+ optional format, partial, cost terms)",
    "shared team reward: answer F1 (``partial``) minus token and tool-use costs; EM is ``correct``",
)


def register_tool_envs() -> None:
    """Register the tool-using variants and the RAG teams (no data is loaded)."""
    register(
        "arith-calc-duo-v0",
        _ENTRY,
        kwargs={"task": "arith", "profiles": "calc_duo", "tool_config": _CALC_TOOLS},
        description="procedural integer arithmetic, offline; reasoner -> actor with a calculator tool",
    )
    register(
        "gsm8k-calc-duo-v0",
        _ENTRY,
        kwargs={"task": "gsm8k", "profiles": "calc_duo", "split": "train", "tool_config": _CALC_TOOLS},
        description="GSM8K grade-school math; reasoner -> actor with a calculator tool",
    )
    for team, what in (("solo", "generator with the search tool"),
                       ("quartet", "rewriter -> selector (search tool) -> filter -> generator")):
        register(
            f"rag-{team}-v0",
            _ENTRY,
            kwargs={"task": _RAG_TASK, "profiles": f"rag_{team}",
                    "reward": _RAG_REWARD, "tool_config": _RAG_TOOLS},
            description=f"multi-hop QA over a local corpus (offline KB; hotpotqa, nq); {what}; reward answer F1",
        )


register_tool_envs()
