"""Tasks: problem sources plus graders (see :mod:`marft_envs.tasks.base`).

``TASKS`` maps the short names used in env kwargs (``task="arith"``) to
``"module:Class"`` strings, so naming a task never imports its module (or
loads its data) until an env is made.
"""

from __future__ import annotations

import importlib

from marft_envs.tasks.base import DatasetTask, DemoSeat, GradeResult, Problem, Task, demo_seat

__all__ = ["TASKS", "DatasetTask", "DemoSeat", "GradeResult", "Problem", "Task", "demo_seat", "resolve_task_class"]

TASKS: dict[str, str] = {
    "arith": "marft_envs.tasks.arith:ArithTask",
    "echo": "marft_envs.tasks.echo:EchoTask",
    "gsm8k": "marft_envs.tasks.gsm8k:GSM8KTask",
    "humaneval": "marft_envs.tasks.code:HumanEvalTask",
    "math": "marft_envs.tasks.math:MathTask",
    "mbpp": "marft_envs.tasks.code:MBPPTask",
}


def resolve_task_class(name: str) -> type[Task]:
    """A task class from a short name in ``TASKS`` or a ``"module:Class"`` path."""
    path = TASKS.get(name, name)
    if ":" not in path:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}, or give 'module:Class'")
    module, attr = path.split(":", 1)
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"{path!r} is not a Task subclass")
    return cls
