"""OpenTelemetry spans of a program team's calls (optional: ``pip install marft[otel]``).

For users who already watch their agents with OpenTelemetry. Every answered call of a
program env (an action whose transition carries the collector's call trace, see
docs/programs.md "Traces") becomes one span, child of one span per episode, with the
GenAI semantic-convention attributes:

| attribute | value |
|---|---|
| ``gen_ai.operation.name`` | ``"chat"`` |
| ``gen_ai.provider.name`` / ``gen_ai.system`` | ``"marft"`` |
| ``gen_ai.request.model``, ``gen_ai.agent.name`` | the role |
| ``gen_ai.usage.input_tokens`` / ``output_tokens`` | prompt / sampled token counts |
| ``gen_ai.response.finish_reasons`` | ``[finish_reason]`` |
| ``gen_ai.conversation.id`` | the program's episode id (the one in its ``base_url``) |
| ``agent.trajectory.step`` | the call's place in its episode (answer order) |

plus ``marft.episode_id``, ``marft.call_index``, ``marft.train_step`` and
``marft.reward``. A call span lasts its latency (arrival at the server to answer).
:class:`OTelCallback` exports every training step's episodes:
``Trainer(..., callbacks=[OTelCallback()])`` (the global tracer provider, or ``tracer=``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from marft_algos.callbacks import Callback

__all__ = ["OTelCallback", "export_episodes"]


def _tracer(tracer: Any) -> Any:
    if tracer is not None:
        return tracer
    try:
        # deferred: OpenTelemetry is an optional dependency
        from opentelemetry import trace
    except ImportError as e:
        raise ImportError("OpenTelemetry export needs the otel extra: pip install 'marft[otel]'") from e
    return trace.get_tracer("marft")


def export_episodes(episodes: Iterable[Any], *, step: int = 0, tracer: Any = None) -> int:
    """One span per program call of ``episodes`` (and one per episode); the number of call spans."""
    # deferred: OpenTelemetry is an optional dependency
    from opentelemetry import trace

    tracer = _tracer(tracer)
    count = 0
    for ep in episodes:
        calls = [t for t in ep.transitions if isinstance(t.info.get("trace"), dict)]
        if not calls:
            continue
        end = time.time_ns()
        latencies = [int(float(t.info["trace"].get("latency_s") or 0.0) * 1e9) for t in calls]
        root = tracer.start_span(f"episode {ep.episode_id}", start_time=end - sum(latencies) - 1, attributes={
            "gen_ai.operation.name": "invoke_agent", "marft.episode_id": int(ep.episode_id),
            "marft.train_step": int(step), "marft.team_return": float(ep.team_return)})
        ctx = trace.set_span_in_context(root)
        t_end = end - sum(latencies)
        for pos, (t, lat) in enumerate(zip(calls, latencies, strict=True)):
            tr = t.info["trace"]
            start, t_end = t_end, t_end + lat
            span = tracer.start_span(f"chat {t.agent}", context=ctx, start_time=start, attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "marft",
                "gen_ai.system": "marft",
                "gen_ai.request.model": str(tr.get("role") or t.agent),
                "gen_ai.agent.name": str(t.agent),
                "gen_ai.usage.input_tokens": len(t.prompt_ids),
                "gen_ai.usage.output_tokens": len(t.response_ids),
                "gen_ai.response.finish_reasons": [str(t.finish_reason)],
                "gen_ai.conversation.id": str(tr.get("program_episode") or ep.episode_id),
                "agent.trajectory.step": pos,
                "marft.episode_id": int(ep.episode_id),
                "marft.call_index": int(tr.get("call", pos)),
                "marft.train_step": int(step),
                "marft.reward": float(t.credited_reward),
            })
            span.end(end_time=t_end)
            count += 1
        root.end(end_time=max(end, t_end))
    return count


class OTelCallback(Callback):
    """Export each training step's program calls as spans (:func:`export_episodes`)."""

    def __init__(self, tracer: Any = None) -> None:
        self.tracer = _tracer(tracer)
        self.spans = 0

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Spans of ``batch``'s episodes, tagged with the training step."""
        self.spans += export_episodes(batch.episodes, step=int(getattr(trainer, "global_step", 0)), tracer=self.tracer)
