"""Built-in environment ids, registered when ``marft_envs`` is imported.

Every id is a :class:`~marft_envs.text_env.TextTeamEnv` over one task and one
built-in team (``marft_envs/profiles/<team>.json``). Entry points and task
classes are named by strings, so registering imports no task module and loads
no data: GSM8K and MATH load at ``make``/``reset`` (``data_dir=`` or
``MARFT_DATA_DIR``, else the Hugging Face Hub).

=====================  =====================================  ===================
id                     team (topology)                        task (default split)
=====================  =====================================  ===================
arith-solo-v0          actor                                  arith (train)
arith-duo-v0           reasoner -> actor (chain)              arith (train)
arith-trio-v0          solver_a, solver_b -> aggregator (DAG)  arith (train)
arith-routed-v0        orchestrator -> one specialist         arith (train)
gsm8k-{solo,duo,trio}  as above                               GSM8K (train)
math-{solo,duo,trio,   as above                               MATH (train; ``split="test"``
routed}-v0                                                    or ``"test500"``)
echo-duo-v0            speaker -> listener (chain)            echo toy task
=====================  =====================================  ===================
"""

from __future__ import annotations

from marft_envs.registration import register

__all__ = ["BUILTIN_ENV_IDS", "register_builtin_envs"]

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

BUILTIN_ENV_IDS: tuple[str, ...] = tuple(
    f"{task}-{team}-v0" for task, (_, teams, _) in _TASKS.items() for team in teams
) + ("echo-duo-v0",)


def register_builtin_envs() -> None:
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
