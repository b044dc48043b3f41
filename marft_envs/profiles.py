"""Agent profiles and teams.

A profile is the reference implementation's JSON object ``{"role", "prompt",
"with_answer"}`` plus optional fields: ``depends_on`` (the roles whose actions
this agent sees), per-agent ``sampling`` / ``eval_sampling`` settings and the
``model`` / ``adapter`` that plays the role. A :class:`Team` is the profiles
plus a topology (the dependency function D).

A profile file is either a JSON list of profiles (the reference format) or an
object ``{"profiles": [...], "topology": {...}}``. For a list, the topology is
a :class:`~marft_envs.topology.Chain` in list order when no profile sets
``depends_on`` (the reference semantics: agent ``i`` sees agents ``0..i-1``),
otherwise the :class:`~marft_envs.topology.DAG` given by ``depends_on``.
Built-in teams (``marft_envs/profiles/*.json``): ``solo``, ``duo``, ``trio``,
``routed`` (math-like tasks) and ``echo`` (the echo toy task).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Any

import numpy as np

from marft_envs.topology import DAG, Chain, Topology, TopologyError, topology_from_dict

__all__ = ["AgentProfile", "Team", "SAMPLING_KEYS", "builtin_teams", "check_sampling", "load_profiles"]

#: Keys accepted in ``sampling`` / ``eval_sampling`` (what the trainers' SamplingParams take).
SAMPLING_KEYS = frozenset({"temperature", "top_p", "max_new_tokens", "stop"})


def _number(value: Any) -> bool:
    """A real number that JSON could have written (bools are not numbers here)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_sampling(settings: Any, where: str) -> dict[str, Any]:
    """``settings`` as a dict, or a ValueError naming ``where`` (e.g. ``"agent 'actor': field
    'sampling'"``), the key and the valid values.

    ``temperature``: a finite number >= 0; ``top_p``: a number in (0, 1];
    ``max_new_tokens``: an integer >= 1; ``stop``: a string or a list of strings.
    """
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ValueError(f"{where} must be an object of settings, got {type(settings).__name__}")
    value = dict(settings)
    unknown = sorted(set(value) - SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown sampling keys {unknown}; valid keys: {sorted(SAMPLING_KEYS)}")
    t, p, n, stop = (value.get(k) for k in ("temperature", "top_p", "max_new_tokens", "stop"))
    if "temperature" in value and not (_number(t) and math.isfinite(t) and t >= 0):
        raise ValueError(f"{where}.temperature must be a number >= 0 (0 = greedy), got {t!r}")
    if "top_p" in value and not (_number(p) and 0 < p <= 1):
        raise ValueError(f"{where}.top_p must be a number in (0, 1], got {p!r}")
    if "max_new_tokens" in value and not (
        isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1
    ):
        raise ValueError(f"{where}.max_new_tokens must be an integer >= 1, got {n!r}")
    if "stop" in value and not (
        stop is None or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(x, str) for x in stop))
    ):
        raise ValueError(f"{where}.stop must be a string or a list of strings, got {stop!r}")
    return value


@dataclass(frozen=True)
class AgentProfile:
    """One agent of a team.

    Attributes:
        role: the agent's name (its PettingZoo agent id).
        prompt: the system prompt.
        with_answer: whether this agent's action is graded (the answering agent).
        depends_on: roles whose actions this agent sees (``None``: decided by the team).
        sampling: generation settings for training rollouts (``temperature``,
            ``top_p``, ``max_new_tokens``, ``stop``).
        eval_sampling: the same for evaluation.
        model: base model name or alias playing this role (``None``: the trainer's default).
        adapter: LoRA adapter name for this role (``None``: the role name).
        tools: the tools this agent may call: registered names (``"calculator"``),
            ``"module:attr"`` paths or :class:`~marft_envs.tools.Tool` objects (see
            :mod:`marft_envs.tools`); resolved when an env is made.
    """

    role: str
    prompt: str
    with_answer: bool = False
    depends_on: tuple[str, ...] | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    eval_sampling: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    adapter: str | None = None
    tools: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role.strip():
            raise ValueError(f"a profile needs a non-empty role, got {self.role!r}")
        agent = f"agent {self.role!r}"
        if not isinstance(self.prompt, str):
            raise ValueError(f"{agent}: field 'prompt' must be a string, got {type(self.prompt).__name__}")
        if not isinstance(self.with_answer, (bool, np.bool_)):
            # bool("false") is True: a quoted JSON boolean would silently grade this agent.
            raise ValueError(
                f"{agent}: field 'with_answer' must be true or false (a JSON boolean, unquoted), "
                f"got {self.with_answer!r}"
            )
        object.__setattr__(self, "with_answer", bool(self.with_answer))
        if self.depends_on is not None:
            deps = [self.depends_on] if isinstance(self.depends_on, str) else self.depends_on
            if not (isinstance(deps, (list, tuple)) and all(isinstance(d, str) for d in deps)):
                raise ValueError(
                    f"{agent}: field 'depends_on' must be a role name or a list of role names, "
                    f"got {self.depends_on!r}"
                )
            object.__setattr__(self, "depends_on", tuple(deps))
        for name in ("model", "adapter"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"{agent}: field {name!r} must be a non-empty string or null, got {value!r}")
        for name in ("sampling", "eval_sampling"):
            object.__setattr__(self, name, check_sampling(getattr(self, name), f"{agent}: field {name!r}"))
        tools = [self.tools] if isinstance(self.tools, str) else list(self.tools or ())
        for t in tools:
            if not isinstance(t, str) and not hasattr(t, "schema"):
                raise ValueError(f"{agent}: a tool is a name, 'module:attr' or a Tool, got {t!r:.60}")
        object.__setattr__(self, "tools", tuple(tools))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentProfile:
        """Build from the JSON form; unknown keys are rejected (they are usually typos)."""
        valid = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"unknown profile keys {unknown}; valid keys: {sorted(valid)}")
        if "role" not in d or "prompt" not in d:
            raise ValueError(f"a profile needs 'role' and 'prompt', got keys {sorted(d)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, the reference profile format plus our extra fields."""
        d = asdict(replace(self, tools=()))  # Tool objects are not data: named below
        d["sampling"] = dict(self.sampling)
        d["eval_sampling"] = dict(self.eval_sampling)
        if self.depends_on is not None:
            d["depends_on"] = list(self.depends_on)
        d["tools"] = [t if isinstance(t, str) else t.name for t in self.tools]  # Tool objects by name
        return d


def builtin_teams() -> list[str]:
    """Names of the profile files shipped in ``marft_envs/profiles/``."""
    root = resources.files("marft_envs") / "profiles"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def load_profiles(source: str | os.PathLike | Sequence | Mapping) -> Any:
    """Read a profile source: a built-in team name, a JSON file path, or already-parsed JSON."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.endswith(".json") and os.sep not in path and "/" not in path:
            res = resources.files("marft_envs") / "profiles" / f"{path}.json"
            if not res.is_file():
                raise ValueError(f"unknown built-in team {path!r}; built-in teams: {builtin_teams()}")
            return json.loads(res.read_text(encoding="utf-8"))
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); a profile file is a "
                             "JSON list of profiles or {\"profiles\": [...], \"topology\": {...}}") from e
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); re-save it as UTF-8") from e
    return source


@dataclass
class Team:
    """Profiles plus the topology that orders them.

    Attributes:
        profiles: ``{role: AgentProfile}`` in declaration order.
        topology: the dependency function D over the roles.
        name: a label (the built-in team name or the file name).
    """

    profiles: dict[str, AgentProfile]
    topology: Topology
    name: str = "team"

    def __post_init__(self) -> None:
        if set(self.profiles) != set(self.topology.agents):
            raise TopologyError(
                f"team roles {list(self.profiles)} and topology agents {list(self.topology.agents)} differ"
            )
        if not any(p.with_answer for p in self.profiles.values()):
            raise ValueError(f"team {self.name!r}: no profile has with_answer=true, nothing would be graded")

    @property
    def agents(self) -> list[str]:
        """Roles in declaration order (the env's ``possible_agents``)."""
        return list(self.profiles)

    @property
    def answer_agents(self) -> list[str]:
        """Roles whose output is graded (``with_answer``), in team order."""
        return [r for r, p in self.profiles.items() if p.with_answer]

    @classmethod
    def from_profiles(
        cls,
        profiles: Sequence[AgentProfile | Mapping[str, Any]],
        topology: Topology | Mapping[str, Any] | None = None,
        name: str = "team",
    ) -> Team:
        """A team from profiles; without ``topology`` use ``depends_on`` (DAG) or list order (Chain)."""
        profs = [p if isinstance(p, AgentProfile) else AgentProfile.from_dict(p) for p in profiles]
        if not profs:
            raise ValueError("a team needs at least one profile")
        roles = [p.role for p in profs]
        if len(set(roles)) != len(roles):
            raise ValueError(f"duplicate roles in profiles: {roles}")
        if isinstance(topology, Mapping):
            topology = topology_from_dict(topology)
        if topology is None:
            if any(p.depends_on is not None for p in profs):
                topology = DAG({p.role: list(p.depends_on or ()) for p in profs})
            else:
                topology = Chain(roles)
        return cls({p.role: p for p in profs}, topology, name)

    @classmethod
    def load(cls, source: Team | str | os.PathLike | Sequence | Mapping) -> Team:
        """A team from a built-in name (``"duo"``), a JSON path, a profile list or ``{"profiles", "topology"}``."""
        if isinstance(source, Team):
            return source
        name = "team"
        if isinstance(source, (str, os.PathLike)):
            name = os.path.basename(os.fspath(source))
            name = name[: -len(".json")] if name.endswith(".json") else name
        data = load_profiles(source)
        if not isinstance(source, (str, os.PathLike)):
            return cls._from_data(data, name)
        where = os.fspath(source)
        if not where.endswith(".json") and os.sep not in where and "/" not in where:
            where = f"built-in team {where!r} (marft_envs/profiles/{where}.json)"
        try:
            return cls._from_data(data, name)
        except (ValueError, TypeError) as e:  # name the file: the message names agent and field
            raise type(e)(f"{where}: {e}") from e

    @classmethod
    def _from_data(cls, data: Any, name: str) -> Team:
        """A team from parsed JSON (a profile list or ``{"profiles", "topology"}``)."""
        if isinstance(data, Mapping):
            if "profiles" not in data:
                raise ValueError("a team object needs a 'profiles' list (and optionally 'topology')")
            unknown = sorted(set(data) - {"profiles", "topology", "name"})
            if unknown:
                raise ValueError(f"unknown team keys {unknown}; valid keys: ['name', 'profiles', 'topology']")
            return cls.from_profiles(data["profiles"], data.get("topology"), data.get("name", name))
        if isinstance(data, Sequence) and not isinstance(data, str):
            return cls.from_profiles(list(data), None, name)
        raise TypeError(f"cannot build a team from {type(data).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``Team.load(team.to_dict())`` round-trips)."""
        return {
            "name": self.name,
            "profiles": [p.to_dict() for p in self.profiles.values()],
            "topology": self.topology.to_dict(),
        }

    def __repr__(self) -> str:
        return f"Team({self.name!r}, {self.topology!r})"
