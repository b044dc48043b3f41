"""Small structural types for the parts that meet at the library's seams.

A function that takes a policy or an env names what it uses of it, not ``Any``:
:class:`RolloutPolicy` is the team policy as the collector, evaluation and games see it
(encode a role's messages, generate a batch); :class:`ServedPolicy` adds what the
OpenAI-compatible server reads (the roles, a role's tokenizer and context window);
:class:`TextEnv` is the PettingZoo AEC surface of a team env that evaluation drives.
:class:`~marft_algos.models.policy.TeamPolicy` and every ``marft_envs`` team env satisfy
them, and so does a scripted stand-in (``tests/helpers/scripted.py``) without
inheriting from anything. The engine side has its own, smaller
:class:`~marft_algos.engines.base.PolicyLike`.

Standard library only at import time: the request and result types are named for the
type checker alone, so importing a Protocol loads neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: see the module docstring
    from marft_algos.models.sampling import GenRequest, GenResult

__all__ = ["RolloutPolicy", "ServedPolicy", "TextEnv"]


@runtime_checkable
class RolloutPolicy(Protocol):
    """A team policy as rollouts use it: a prompt encoder and one batched generator per team."""

    def encode(self, role: str, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """``role``'s prompt token ids for chat ``messages``."""
        ...

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """One result per sample of each request, in request order."""
        ...


@runtime_checkable
class ServedPolicy(RolloutPolicy, Protocol):
    """A :class:`RolloutPolicy` the server can also name and tokenize for (chat templates, limits)."""

    roles: list[str]

    def tokenizer(self, role: str) -> Any:
        """``role``'s tokenizer (its chat template renders requests)."""
        ...

    def max_context(self, role: str) -> int:
        """``role``'s prompt + response token limit."""
        ...


@runtime_checkable
class TextEnv(Protocol):
    """The PettingZoo AEC surface of a text team env (``marft_envs.make(...)``) that is driven here
    (as in PettingZoo, the per-episode attributes exist from the first :meth:`reset`)."""

    possible_agents: list[str]
    agents: list[str]
    agent_selection: str
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start an episode (``options``: e.g. ``{"problem_index": i}``)."""
        ...

    def step(self, action: Any) -> None:
        """Act for :attr:`agent_selection` (``None`` for an agent that is done)."""
        ...

    def messages(self, agent: str) -> list[dict[str, Any]]:
        """The chat messages ``agent`` sees now (its prompt, before encoding)."""
        ...
