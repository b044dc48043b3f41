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


# ---------------------------------------------------------------------------------------
# Games and dialogue (issue 17). Appended block: per-agent-reward games and the doctor
# dialogue env are AECEnv subclasses of their own (marft_envs.games, marft_envs.dialogue);
# their docs pages come from those packages' docstrings.
# ---------------------------------------------------------------------------------------

#: Game and dialogue ids registered below (plus TextArena-backed ``game-*-v0`` ids when it is installed).
GAME_ENV_IDS: tuple[str, ...] = ("game-nim-v0", "game-matrix-v0", "dialogue-doctor-v0")
__all__ += ["GAME_ENV_IDS", "register_game_envs"]


def register_game_envs() -> None:
    """Register ``game-nim-v0``, ``game-matrix-v0``, ``dialogue-doctor-v0`` and, when the optional
    ``textarena`` package is installed, its offline two-player games (it is not imported here)."""
    register("game-nim-v0", "marft_envs.games:nim_env",
             description="zero-sum Nim (one pile, take 1-3, last stone wins); optimal play known")
    register("game-matrix-v0", "marft_envs.games:matrix_env",
             description="general-sum matrix game (prisoner's dilemma; game=, rounds=)")
    register("dialogue-doctor-v0", "marft_envs.dialogue:doctor_env",
             description="doctor questions a scripted patient with a hidden case card, then diagnoses")
    from marft_envs.games.textarena_adapter import TEXTARENA_GAMES, textarena_available

    if textarena_available():  # the optional extra is installed: offer its offline two-player games
        for env_id, (ta_id, _) in TEXTARENA_GAMES.items():
            register(env_id, "marft_envs.games:textarena_env", kwargs={"game": env_id},
                     description=f"TextArena's {ta_id.removesuffix('-v0-raw')} (optional extra 'textarena')")


register_game_envs()
