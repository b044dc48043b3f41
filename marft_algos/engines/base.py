"""The generation-engine interface: what a rollout engine must implement.

A trainer or collector talks to an engine in three moves:

1. :meth:`GenerationEngine.generate` a batch of requests. A request
   (:class:`~marft_algos.models.sampling.GenRequest`) carries the role (which picks the
   base model and the role's adapter), the prompt token ids, the sampling settings
   (:class:`~marft_algos.models.sampling.SamplingParams`) and a sample count ``n``; a
   result (:class:`~marft_algos.models.sampling.GenResult`) carries the sampled token
   ids, the per-token log-probs, the decoded text and a finish reason.
2. After an update, push the new weights: :meth:`GenerationEngine.set_adapter_weights`
   for one role, or :meth:`GenerationEngine.sync_weights` to take every role's current
   weights from the policy.
3. Around the update, :meth:`GenerationEngine.sleep` / :meth:`GenerationEngine.wake_up`
   release and reacquire the engine's memory (KV cache, a second copy of the weights).

Streaming: :meth:`GenerationEngine.generate_stream` takes keyed requests and a callback
``on_done(key, result)`` that may return follow-up requests; an episode's next agent is
submitted as soon as its predecessor's action is done. The default runs rounds of
:meth:`generate`; the ``hf`` engine overrides it with continuous batching (follow-ups
join the running batch, ``docs/engines.md``).

The exactness contract: ``result.token_ids`` are the tokens that were sampled (EOS
included; cut after the token that completes a stop string), and
``result.logprobs[j]`` is the log-prob of ``token_ids[j]`` under
``log_softmax(logits / temperature)`` of the weights the engine sampled with, the number
:meth:`~marft_algos.models.policy.TeamPolicy.sequence_logprobs` recomputes for the same
prompt, ids and temperature (up to float rounding). PPO ratios are taken between the
two, so an engine that cannot meet it must say so and by how much.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from marft_algos.models.sampling import FinishReason, GenRequest, GenResult, SamplingParams

__all__ = ["FinishReason", "GenRequest", "GenResult", "GenerationEngine", "OnDone", "PolicyLike", "SamplingParams"]

#: ``on_done(key, result)`` of :meth:`GenerationEngine.generate_stream`: the follow-up
#: ``(key, request)`` pairs to submit (or None)
OnDone = Callable[[Any, GenResult], "Iterable[tuple[Hashable, GenRequest]] | None"]


class PolicyLike(Protocol):
    """What any engine may rely on in the policy it serves (:class:`~marft_algos.models.policy.TeamPolicy`
    is one). The base class types against this instead of importing the policy's module, which
    builds its engine through :mod:`marft_algos.engines` (an import circle otherwise); an engine
    that needs more of the policy (the ``hf`` engine: its loaded bases) types against ``TeamPolicy``."""

    roles: list[str]
    mode: str
    max_batch: int

    def adapter_of(self, role: str) -> str | None:
        """The adapter name ``role`` samples with (None in full fine-tuning)."""
        ...

    def load_adapter_state_dict(self, role: str, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights into ``role``'s adapter in place."""
        ...


def check_stream_request(key: Hashable, request: GenRequest) -> None:
    """A streamed request is one sample: ``n > 1`` would report ``n`` results under one key."""
    if int(request.n) != 1:
        raise ValueError(
            f"generate_stream takes one sample per request, got n={request.n} for key {key!r}: "
            "submit n requests with distinct keys (identical prompts joining together are prefilled once)"
        )


def _round_seeds(seed: int) -> Iterator[int]:
    """Seeds for successive rounds of a seeded stream (deterministic in ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        yield int(torch.randint(0, 2**31 - 1, (1,), generator=g))


class GenerationEngine(abc.ABC):
    """A rollout engine bound to one team policy (a :class:`PolicyLike`, e.g. :class:`~marft_algos.models.policy.TeamPolicy`).

    Subclasses implement :meth:`generate` and :meth:`set_adapter_weights`; the other
    methods have defaults that fit an engine sharing the policy's weights in memory.
    An engine is built as ``engine_class(policy, **options)`` (see
    :func:`marft_algos.engines.get_engine`).

    Args:
        policy: the team policy whose roles, adapters and tokenizers the engine serves.
    """

    #: the registry name of the engine (``"hf"``, ...)
    name: str = ""
    #: True when ``result.logprobs`` meet the exactness contract above. False for an engine
    #: that returns its own numbers (vLLM with ``logprob_source="engine"``): the trainer then
    #: recomputes the old log-probs with its forward and weights the policy gradient by the
    #: truncated importance ratio (:meth:`marft_algos.trainer.Trainer.tis_weights`)
    logprobs_exact: bool = True

    def __init__(self, policy: PolicyLike) -> None:
        self.policy = policy

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> list[GenResult]:
        """One result per request (``n`` consecutive results for a request with ``n > 1``),
        in request order. ``seed`` makes the draws reproducible."""

    def generate_groups(self, request: GenRequest, n: int, *, seed: int | None = None) -> list[GenResult]:
        """``n`` samples of one prompt (a GRPO group)."""
        return self.generate([GenRequest(request.role, list(request.prompt_ids), request.sampling, n=n)], seed=seed)

    def generate_stream(
        self, requests: Iterable[tuple[Hashable, GenRequest]], on_done: OnDone, *, seed: int | None = None
    ) -> None:
        """Generate keyed requests; call ``on_done(key, result)`` as each one finishes.

        ``on_done`` may return follow-up ``(key, request)`` pairs, which are generated too
        (e.g. an episode's next agent, once its predecessor's action was stepped). Returns
        when no request is left. Each request must have ``n == 1``.

        This default runs rounds: one :meth:`generate` of everything pending, then the
        callbacks in submission order, then the next round with their follow-ups. Engines
        with continuous batching override it (the ``hf`` engine).
        """
        pending = list(requests)
        gen = None if seed is None else _round_seeds(seed)
        while pending:
            for key, req in pending:
                check_stream_request(key, req)
            results = self.generate([r for _, r in pending], seed=None if gen is None else next(gen))
            follow: list[tuple[Hashable, GenRequest]] = []
            for (key, _), res in zip(pending, results, strict=True):
                follow += list(on_done(key, res) or ())
            pending = follow

    @abc.abstractmethod
    def set_adapter_weights(self, role: str, state: Mapping[str, torch.Tensor]) -> None:
        """Sample ``role`` from these trainable weights from now on (the keys of
        :meth:`TeamPolicy.adapter_state_dict`)."""

    def sync_weights(self) -> None:  # noqa: B027 (an intentional no-op default, not a missing abstractmethod)
        """Take every role's current weights from the policy (after an update).

        The default does nothing: right for an engine that reads the policy's own
        parameter tensors."""

    def sleep(self) -> None:  # noqa: B027 (an intentional no-op default, not a missing abstractmethod)
        """Release memory the engine holds between rollouts (before the update).

        The default does nothing."""

    def wake_up(self) -> None:  # noqa: B027 (an intentional no-op default, not a missing abstractmethod)
        """Reacquire what :meth:`sleep` released (before the next rollout).

        The default does nothing."""

    def metrics(self) -> dict[str, float]:
        """Engine metrics since the last call, for the trainer's step metrics (default:
        none; the ``vllm`` engine reports its log-prob gap to the trainer per role)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """A short summary for logs: the engine's name and settings."""
        return {"engine": self.name}
