"""The algorithm registry: algorithm names -> trainer and config classes.

Built-in algorithms are listed once, in :data:`BUILTIN_ALGORITHMS`, as lazy
``"module:Class"`` strings (the style of ``marft_envs``' env registry): looking one up
imports only its module, and this module imports no algorithm, so the registry never
sits in an import circle. Third parties call :func:`register_algorithm` with classes
(or ``"module:Class"`` strings)::

    register_algorithm("my-ppo", MyTrainer, MyConfig, "PPO with my twist")

An algorithm's name is written only here (or in the third party's
``register_algorithm`` call): a config learns its name from the registry
(:func:`algorithm_name`), it does not repeat it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALGORITHMS",
    "BUILTIN_ALGORITHMS",
    "AlgorithmSpec",
    "UnknownAlgorithmError",
    "algorithm_name",
    "get_algorithm",
    "lazy_exports",
    "list_algorithms",
    "register_algorithm",
]

#: name -> (trainer "module:Class", config "module:Class", one-line summary)
BUILTIN_ALGORITHMS: dict[str, tuple[str, str, str]] = {
    "grpo": (
        "marft_algos.algos.grpo:GRPOTrainer",
        "marft_algos.algos.grpo:GRPOConfig",
        "GRPO: group-relative advantages (group-wise or agent-wise), DAPO clip-higher and dynamic sampling",
    ),
    "ippo": (
        "marft_algos.algos.ippo:IPPOTrainer",
        "marft_algos.algos.ippo:IPPOConfig",
        "Independent PPO: one value head per agent on the frozen base, per-agent GAE",
    ),
    "marft-action": (
        "marft_algos.algos.marft_action:MARFTActionTrainer",
        "marft_algos.algos.marft_action:MARFTActionConfig",
        "Action-level MARFT: chain GAE over (turn, agent) actions, whole-action PPO ratios, shared critic, "
        "agent-by-agent option, collapse recovery",
    ),
    "marft-token": (
        "marft_algos.algos.marft_token:MARFTTokenTrainer",
        "marft_algos.algos.marft_token:MARFTTokenConfig",
        "Token-level MARFT: per-token values and Bellman backup across agents, per-token PPO ratios, shared critic, "
        "collapse recovery",
    ),
}


def _load(entry: type | str) -> type:
    """A class, or the class a ``"module:Class"`` string names (imported on demand)."""
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def lazy_exports(module: str, names: dict[str, str]) -> Any:
    """A module ``__getattr__`` that imports ``names[name]`` (a module path) on first access.

    Keeps heavy or circular re-exports lazy: ``__getattr__ = lazy_exports(__name__, {...})``.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@dataclass(frozen=True)
class AlgorithmSpec:
    """A registered algorithm: its trainer class, config class and a one-line summary.

    ``trainer_cls`` / ``config_cls`` may be ``"module:Class"`` strings until the
    algorithm is first looked up (:func:`get_algorithm` returns them resolved).
    """

    name: str
    trainer_cls: Any
    config_cls: Any
    description: str = ""

    @property
    def resolved(self) -> bool:
        """Both classes are imported (not ``"module:Class"`` strings)."""
        return not isinstance(self.trainer_cls, str) and not isinstance(self.config_cls, str)

    def load(self) -> AlgorithmSpec:
        """This spec with both classes imported (and checked)."""
        if self.resolved:
            return self
        return self.load_checked()

    def load_checked(self) -> AlgorithmSpec:
        """Import both classes, check them, and fill the summary from the trainer's docstring."""
        trainer_cls, config_cls = _load(self.trainer_cls), _load(self.config_cls)
        _check_classes(trainer_cls, config_cls)
        doc = self.description or next(iter((trainer_cls.__doc__ or "").strip().splitlines()), "")
        return AlgorithmSpec(name=self.name, trainer_cls=trainer_cls, config_cls=config_cls, description=doc)


#: every registered algorithm by name (built-ins are in from the start, as lazy strings)
ALGORITHMS: dict[str, AlgorithmSpec] = {
    name: AlgorithmSpec(name, trainer, config, doc) for name, (trainer, config, doc) in BUILTIN_ALGORITHMS.items()
}


class UnknownAlgorithmError(KeyError):
    """An algorithm name that is not registered (the message suggests close names)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def _check_classes(trainer_cls: Any, config_cls: Any) -> None:
    # A TrainConfig is recognised by shape (a dataclass with check_agents): importing
    # marft_algos.config here would put the registry back into an import circle.
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls) and hasattr(config_cls, "check_agents")):
        raise TypeError(f"config_cls must be a TrainConfig subclass, got {config_cls!r}")
    if not isinstance(trainer_cls, type):
        raise TypeError(f"trainer_cls must be a Trainer subclass, got {trainer_cls!r}")


def register_algorithm(
    name: str,
    trainer_cls: type | str,
    config_cls: type | str | None = None,
    description: str = "",
    *,
    overwrite: bool = False,
) -> AlgorithmSpec:
    """Register ``trainer_cls`` / ``config_cls`` under ``name`` (e.g. ``"my-ppo"``).

    Either may be a ``"module:Class"`` string, imported on first lookup. ``config_cls``
    defaults to the trainer's ``config_cls`` attribute. Registering another trainer under
    a taken name raises unless ``overwrite=True``.
    """
    old = ALGORITHMS.get(name)
    if old is not None and not overwrite:
        same = old.trainer_cls is trainer_cls or (
            isinstance(old.trainer_cls, str) and not isinstance(trainer_cls, str) and old.trainer_cls == _qualname(trainer_cls)
        )
        if not same:
            shown = old.trainer_cls if isinstance(old.trainer_cls, str) else old.trainer_cls.__name__
            raise ValueError(f"algorithm {name!r} is already registered ({shown}); pass overwrite=True to replace it")
    if config_cls is None:
        config_cls = _load(trainer_cls).config_cls
    spec = AlgorithmSpec(name=name, trainer_cls=trainer_cls, config_cls=config_cls, description=description)
    if spec.resolved:  # check now; strings are checked when first looked up
        spec = spec.load_checked()
    ALGORITHMS[name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up an algorithm by name; unknown names raise with a "did you mean" hint."""
    if name not in ALGORITHMS:
        close = difflib.get_close_matches(name, list(ALGORITHMS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}{hint} (available: {', '.join(sorted(ALGORITHMS))})")
    spec = ALGORITHMS[name]
    if not spec.resolved:
        spec = ALGORITHMS[name] = spec.load()
    return spec


def list_algorithms() -> list[AlgorithmSpec]:
    """Every registered algorithm, sorted by name (their modules are imported)."""
    return [get_algorithm(k) for k in sorted(ALGORITHMS)]


def algorithm_name(config_cls: type) -> str | None:
    """The registered name of ``config_cls`` (or of its nearest registered base class).

    Compares ``"module:Class"`` strings for algorithms not imported yet, so it imports
    nothing. None for a config no algorithm uses (e.g. a shared base config).
    """
    for cls in config_cls.__mro__:
        qual = _qualname(cls)
        for name, spec in ALGORITHMS.items():
            entry = spec.config_cls
            if entry is cls or entry == qual:
                return name
    return None
