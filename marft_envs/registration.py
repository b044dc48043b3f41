"""The environment registry, in the Gymnasium style.

``register(id, entry_point, kwargs=...)`` records an :class:`EnvSpec`;
``make(id, **kwargs)`` looks it up, deep-copies its kwargs, applies the
overrides and calls the entry point. Ids are ``[namespace/]name-vN``.

Third-party packages register their envs when imported (Gymnasium 1.x has no
entry-point plugin discovery), and ``make("pkg.module:name-v0")`` imports
``pkg.module`` first, so users need no explicit import::

    # in my_pkg/__init__.py
    import marft_envs
    marft_envs.register("mytask-duo-v0", "my_pkg.envs:make_env", kwargs={"level": 2})

    # anywhere
    env = marft_envs.make("my_pkg:mytask-duo-v0")

Kwargs stored in a spec must be JSON-serializable and small (ids, paths,
numbers): ``make`` deep-copies them on every call. Every registration is
mirrored into PettingZoo's own AEC registry (PettingZoo >= 1.27) under the
``marft/`` namespace: ``pettingzoo.make("aec", "marft/arith-duo-v0")``.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
import json
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pettingzoo

from marft_envs.profiles import Team

__all__ = [
    "EnvSpec",
    "Error",
    "RegistryError",
    "EnvArgumentError",
    "check_arguments",
    "NameNotFound",
    "VersionNotFound",
    "registry",
    "register",
    "spec",
    "make",
    "pprint_registry",
    "load_plugins",
    "ENTRY_POINT_GROUP",
    "parse_env_id",
    "PETTINGZOO_NAMESPACE",
]

#: Namespace of the mirrored ids in PettingZoo's registry.
PETTINGZOO_NAMESPACE = "marft"

ENV_ID_RE = re.compile(r"^(?:(?P<namespace>[\w.-]+)/)?(?P<name>[\w.-]+?)(?:-v(?P<version>\d+))?$")


class Error(Exception):
    """Base class of marft_envs registry errors."""


class RegistryError(Error, KeyError):
    """A lookup failure; also a ``KeyError``, as for a dict lookup."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class EnvArgumentError(Error, TypeError):
    """An env or task was given a keyword argument it does not take (e.g. a misspelt one).

    Also a ``TypeError``, what Python raises for an unexpected keyword argument.
    """


def accepted_arguments(fn: Callable[..., Any], *, named_only: bool = False) -> list[str] | None:
    """Keyword arguments ``fn`` accepts, or None when it takes ``**kwargs`` (or has no
    signature); ``named_only``: its named ones even when it also takes ``**kwargs``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if not named_only and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name != "self"]


def check_arguments(
    what: str, fn: Callable[..., Any], given: Iterable[str], hint: str = "", also: Iterable[str] = ()
) -> None:
    """Raise :class:`EnvArgumentError` (one line, with a did-you-mean) when ``fn`` does not take
    one of the keyword arguments ``given``; ``what`` names ``fn`` in the message, ``also`` are
    names elsewhere (the env's own options) that a typo may have meant."""
    accepted = accepted_arguments(fn)
    if accepted is None:
        return
    unknown = [k for k in given if k not in accepted]
    if not unknown:
        return
    bad = unknown[0]
    close = difflib.get_close_matches(bad, [*accepted, *also], n=1)
    msg = f"{what} has no option {bad!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    if len(unknown) > 1:
        msg += f" (also unknown: {', '.join(map(repr, unknown[1:]))})"
    msg += f"; its options: {', '.join(accepted) or '(none)'}"
    raise EnvArgumentError(msg + (f"; {hint}" if hint else ""))


class NameNotFound(RegistryError):
    """No env with this name (in any version)."""


class VersionNotFound(RegistryError):
    """The name exists, but not in the requested version."""


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """``"ns/name-v3"`` -> ``("ns", "name", 3)``."""
    m = ENV_ID_RE.fullmatch(env_id) if isinstance(env_id, str) else None
    if not m:
        raise Error(f"malformed env id {env_id!r}: expected '[namespace/]name[-vN]'")
    version = m.group("version")
    return m.group("namespace"), m.group("name"), int(version) if version is not None else None


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment.

    Attributes:
        id: ``[namespace/]name-vN``.
        entry_point: ``"module:attr"`` (preferred: registering imports nothing) or a callable.
        kwargs: default keyword arguments (JSON-safe; deep-copied by ``make``).
        description: one line shown by :func:`pprint_registry`.
        namespace, name, version: parsed from ``id``.
        agents: the env's ``possible_agents``, read from its team without building it
            (``spec(id).agents``; :meth:`agents_for` with kwargs overrides).
    """

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    namespace: str | None = field(init=False)
    name: str = field(init=False)
    version: int | None = field(init=False)

    def __post_init__(self) -> None:
        ns, name, version = parse_env_id(self.id)
        object.__setattr__(self, "namespace", ns)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "version", version)
        if isinstance(self.entry_point, str):
            if self.entry_point.count(":") != 1 or not all(self.entry_point.split(":")):
                raise Error(f"entry_point must be 'module:attr', got {self.entry_point!r}")
        elif not callable(self.entry_point):
            raise Error(f"entry_point must be 'module:attr' or a callable, got {self.entry_point!r}")
        try:
            json.dumps(self.kwargs)
        except (TypeError, ValueError) as e:
            raise Error(
                f"kwargs of {self.id!r} must be JSON-serializable (small ids, paths and numbers, "
                f"not datasets or models): {e}"
            ) from None

    @property
    def agents(self) -> list[str]:
        """The ``possible_agents`` of ``make(id)``, read from the team (see :meth:`agents_for`)."""
        return self.agents_for()

    def agents_for(self, **kwargs: Any) -> list[str]:
        """The ``possible_agents`` of ``make(id, **kwargs)`` without building the env.

        The team is the ``team`` or ``profiles`` keyword (the registered one updated with
        ``kwargs``): a built-in team name, a JSON path, a profile list or a
        :class:`~marft_envs.profiles.Team`. Reading it loads no task and no data set.
        An entry point that takes no team keyword (it builds its team itself) is called
        once with the merged kwargs to read ``possible_agents``, since nothing else can
        tell its agents.
        """
        merged = {**self.kwargs, **kwargs}
        source = merged.get("team", merged.get("profiles"))
        if source is not None:
            return list(Team.load(source).agents)
        return list(self.make(**kwargs).possible_agents)

    def make(self, **kwargs: Any) -> Any:
        """Instantiate: the registered kwargs (deep-copied) updated with ``kwargs``."""
        merged = copy.deepcopy(self.kwargs)
        merged.update(kwargs)
        fn = load_entry_point(self.entry_point)
        check_arguments(f"environment {self.id!r}", fn, kwargs)  # the caller's own (a typo), before any work
        try:
            return fn(**merged)
        except EnvArgumentError as e:  # raised deeper (an entry point taking **kwargs): name the id
            if repr(self.id) in str(e):
                raise
            raise EnvArgumentError(f"environment {self.id!r}: {e}") from None


registry: dict[str, EnvSpec] = {}


def load_entry_point(entry_point: str | Callable[..., Any]) -> Callable[..., Any]:
    """The callable named by ``'module:attr'`` (imported now, not at register time)."""
    if callable(entry_point):
        return entry_point
    module, attr = entry_point.split(":")
    obj = getattr(importlib.import_module(module), attr)
    if not callable(obj):
        raise Error(f"entry point {entry_point!r} is not callable")
    return obj


def _mirror_to_pettingzoo(env_spec: EnvSpec) -> None:
    # PettingZoo 1.27 added a registry; older versions have none: skip silently.
    if not (hasattr(pettingzoo, "register") and hasattr(pettingzoo, "aec_registry")):
        return
    pz_id = f"{PETTINGZOO_NAMESPACE}/{env_spec.id.split('/')[-1]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-registration warnings are ours to give
        pettingzoo.register("aec", pz_id, env_spec.entry_point, kwargs=copy.deepcopy(env_spec.kwargs))


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    kwargs: dict[str, Any] | None = None,
    description: str = "",
    mirror: bool = True,
) -> EnvSpec:
    """Register an environment (re-registering an id replaces it, with a warning)."""
    new = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs or {}), description=description)
    if id in registry:
        warnings.warn(f"overriding environment {id!r} already in the registry", stacklevel=2)
    registry[id] = new
    if mirror:
        _mirror_to_pettingzoo(new)
    return new


def _versions(namespace: str | None, name: str) -> list[EnvSpec]:
    return sorted(
        (s for s in registry.values() if s.namespace == namespace and s.name == name),
        key=lambda s: -1 if s.version is None else s.version,
    )


def _not_found(env_id: str) -> RegistryError:
    ns, name, version = parse_env_id(env_id)
    versions = _versions(ns, name)
    if versions and version is not None:
        available = ", ".join(s.id for s in versions)
        return VersionNotFound(f"environment {env_id!r} has no version v{version}; available: {available}")
    close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(repr(c) for c in close)}?" if close else ""
    return NameNotFound(
        f"no environment named {env_id!r}.{hint} (marft_envs.pprint_registry() lists all; "
        "third-party envs register when their package is imported, or use make('package:id'))"
    )


#: The entry-point group third-party packages use to register their envs (see docs/environments).
ENTRY_POINT_GROUP = "marft_envs"
_plugins_loaded = False


def load_plugins(*, force: bool = False) -> list[str]:
    """Load every ``marft_envs`` entry point of the installed packages; returns their names.

    A package declares, in its ``pyproject.toml``::

        [project.entry-points.marft_envs]
        my_envs = "my_package.envs"            # a module whose import registers its envs
        more = "my_package.envs:register_all"  # or a function that registers them

    A module is imported, a callable is called with no arguments. Loaded once per process
    (``force`` loads again); :func:`spec` loads them before reporting an unknown id.
    A failing plugin is an :class:`Error` naming it.
    """
    global _plugins_loaded
    if _plugins_loaded and not force:
        return []
    _plugins_loaded = True

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:
            raise Error(f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}") from e
        names.append(ep.name)
    return names


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id`` (``"pkg.module:id"`` imports ``pkg.module`` first).

    An id without a version resolves to the latest version, with a warning.
    """
    if not isinstance(env_id, str):
        raise TypeError(f"env id must be a str, got {type(env_id).__name__}")
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise Error(f"could not import {module!r} to find {env_id!r}: {e}") from e
    if env_id in registry:
        return registry[env_id]
    ns, name, version = parse_env_id(env_id)
    if version is None:
        versions = [s for s in _versions(ns, name) if s.version is not None]
        if versions:
            latest = versions[-1]
            warnings.warn(f"using the latest version {latest.id!r} for the unversioned id {env_id!r}", stacklevel=3)
            return latest
    if not _plugins_loaded and load_plugins():  # an id of an installed plugin package
        return spec(env_id)
    raise _not_found(env_id)


def make(env_id: str | EnvSpec, **kwargs: Any) -> Any:
    """Create the environment ``env_id``; ``kwargs`` override the registered ones.

    Example:
        >>> import marft_envs
        >>> env = marft_envs.make("arith-duo-v0", split="test", reward={"format": 0.1})
    """
    env_spec = env_id if isinstance(env_id, EnvSpec) else spec(env_id)
    env = env_spec.make(**kwargs)
    try:
        env.spec = env_spec  # as Gymnasium does: the env knows how it was made
    except AttributeError:
        pass
    return env


def pprint_registry(*, disable_print: bool = False) -> str | None:
    """Print (or return, with ``disable_print=True``) every registered id, grouped by task family."""
    if not registry:
        out = "(no environments registered)"
    else:
        groups: dict[str, list[EnvSpec]] = {}
        for s in sorted(registry.values(), key=lambda s: s.id):
            family = s.id.split("/")[0] + "/" if s.namespace else s.name.split("-")[0]
            groups.setdefault(family, []).append(s)
        width = max(len(i) for i in registry)
        lines = []
        for family, specs in groups.items():
            lines.append(f"===== {family} =====")
            lines += [f"{s.id:<{width}}  {s.description}".rstrip() for s in specs]
        out = "\n".join(lines)
    if disable_print:
        return out
    print(out)
    return None
