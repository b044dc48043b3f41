"""A batching queue in front of a generation engine: concurrent requests, one engine call.

HTTP handlers run on the server's event loop; the engine is not thread-safe and is
fastest when it decodes many rows together. :class:`EngineBatcher` owns the engine on
one worker thread: a request waits at most ``window_s`` for others, then everything
queued (up to ``max_requests``) is generated in one
:meth:`~marft_algos.engines.base.GenerationEngine.generate` call. A request with a
``seed`` is generated alone with that seed, so the same seeded request gives the same
tokens whatever else is in flight.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from marft_algos.models.sampling import GenRequest, GenResult

__all__ = ["EngineBatcher"]


@dataclass
class _Item:
    requests: list[GenRequest]
    seed: int | None
    future: Future[list[GenResult]] = field(default_factory=Future)


class EngineBatcher:
    """Collect requests for a short window and generate them together (module docstring).

    Args:
        engine: anything with ``generate(requests, seed=None) -> list[GenResult]`` (a
            :class:`~marft_algos.engines.base.GenerationEngine` or a ``TeamPolicy``).
        window_s: how long the first queued request waits for companions.
        max_requests: most requests in one engine call.

    ``stats``: ``engine_calls``, ``requests``, ``largest_batch`` (requests in the
    largest engine call so far).
    """

    def __init__(self, engine: Any, *, window_s: float = 0.01, max_requests: int = 64) -> None:
        if window_s < 0 or max_requests < 1:
            raise ValueError(f"window_s must be >= 0 and max_requests >= 1, got {window_s}, {max_requests}")
        self.engine = engine
        self.window_s = float(window_s)
        self.max_requests = int(max_requests)
        self.stats: Counter[str] = Counter()
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="marft-engine-batcher", daemon=True)
        self._thread.start()

    def submit(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> Future[list[GenResult]]:
        """Queue ``requests`` (generated together, in one engine call); the future holds
        their results in order (``n`` consecutive results for a request with ``n > 1``)."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        item = _Item(list(requests), seed)
        self._queue.put(item)
        return item.future

    def close(self, timeout: float = 30.0) -> None:
        """Stop the worker after what is queued; later :meth:`submit` calls raise."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout)

    def _collect(self, first: _Item) -> tuple[list[_Item], bool]:
        batch, stop = [first], False
        deadline = time.monotonic() + self.window_s
        while len(batch) < self.max_requests:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stop = True
                break
            batch.append(item)
        return batch, stop

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            plain = [it for it in batch if it.seed is None]
            groups = ([plain] if plain else []) + [[it] for it in batch if it.seed is not None]
            for group in groups:
                self._generate(group)

    def _generate(self, group: list[_Item]) -> None:
        reqs = [r for it in group for r in it.requests]
        try:
            results = self.engine.generate(reqs, seed=group[0].seed)
        except BaseException as e:  # the callers get the error; the worker goes on
            for it in group:
                it.future.set_exception(e)
            return
        self.stats["engine_calls"] += 1
        self.stats["requests"] += len(group)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(group))
        at = 0
        for it in group:
            k = sum(max(1, int(r.n)) for r in it.requests)
            it.future.set_result(list(results[at: at + k]))
            at += k
