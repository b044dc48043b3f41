"""A real HTTP server in a thread of this process: uvicorn running the FastAPI app.

Why FastAPI + uvicorn: the OpenAI clients (``openai``, ``langchain-openai``, CrewAI,
AutoGen) speak HTTP/1.1 with JSON bodies and server-sent events; uvicorn is a maintained
ASGI server that does both with keep-alive, runs in a thread of the training process
(no second process holding a copy of the model) and listens on an already-bound socket
(port 0: the OS picks a free port, no race). FastAPI adds the routing and streaming
responses on Starlette with no code of ours in the HTTP layer.

:class:`TeamServer` is the whole serving stack for a ``TeamPolicy``: the
:class:`~marft_algos.serve.batcher.EngineBatcher` in front of its engine, the app, the
server thread. The default host is loopback; any other host needs an API key.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from marft_algos.models.sampling import GenResult
from marft_algos.protocols import ServedPolicy
from marft_algos.serve.app import Dispatch, build_app
from marft_algos.serve.batcher import EngineBatcher
from marft_algos.serve.protocol import DEFAULT_LIMITS, ChatCall, Limits

__all__ = ["API_KEY_ENV", "LOOPBACK", "LoopbackServer", "TeamServer", "TranscriptWriter", "check_exposure"]

#: hosts that only this machine can reach
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: the environment variable read for the API key when none is passed
API_KEY_ENV = "MARFT_API_KEY"


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond loopback without an API key (ValueError saying how)."""
    if host not in LOOPBACK and not api_key:
        raise ValueError(
            f"--host {host} makes the team reachable from other machines: set an API key "
            f"(--api-key KEY or ${API_KEY_ENV}); every request must then send 'Authorization: Bearer KEY'"
        )


class LoopbackServer:
    """Run an ASGI ``app`` with uvicorn in a daemon thread; a context manager.

    Args:
        app: the ASGI app.
        host: the address to listen on (default loopback).
        port: the port (0: a free one, read back as :attr:`port`).
        start_timeout: seconds to wait for the server to accept connections.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, start_timeout: float = 60.0) -> None:
        self.app, self.host, self.port = app, host, int(port)
        self.start_timeout = start_timeout
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> LoopbackServer:
        """Bind, start the thread, and wait until the server is up."""
        # deferred: uvicorn is needed only to serve over a socket
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="marft-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start within {self.start_timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit and join its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self) -> None:
        """Block until the server thread ends (``marft serve``; Ctrl-C raises KeyboardInterrupt here)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class TranscriptWriter:
    """Append one JSON line per answered call: time, episode, role, the exact prompt ids,
    and per choice the sampled ids, their log-probs, the text and the finish reason, plus
    the latency from arrival to result (seconds). Thread-safe; each line is flushed."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, episode: str | None, call: ChatCall, results: Sequence[GenResult], latency_s: float) -> None:
        """One line for ``call`` and its ``results``."""
        line = json.dumps({
            "time": time.time(), "episode": episode, "role": call.role, "prompt_ids": list(call.prompt_ids),
            "choices": [{"token_ids": list(r.token_ids), "logprobs": [float(x) for x in r.logprobs], "text": r.text,
                         "finish_reason": r.finish_reason} for r in results],
            "latency_s": round(latency_s, 6),
        }, ensure_ascii=False)
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


class TeamServer(LoopbackServer):
    """The OpenAI-compatible endpoint of a team policy: batcher + app + server thread.

    Args:
        policy: a ``TeamPolicy`` (its engine generates; its roles are the models).
        roles: the roles to serve (default all).
        host / port: where to listen (a non-loopback host needs ``api_key``).
        api_key: required bearer token (default ``$MARFT_API_KEY``, else none on loopback).
        parser: the tool-call parser of the model family (``hermes``, ``json``, ``mistral``).
        limits: request caps.
        role_defaults: per-role sampling defaults (a trained run's per-role sampling).
        window_s: the batching window.
        dispatch: replace the batcher (a program env routes calls through its episodes).
        episodes: serve the ``/episodes/{id}/v1`` routes too.
        record: ``record(episode, call, results)`` after each call the batcher answered
            (the exact prompt ids are ``call.prompt_ids``; sampled ids and log-probs are in
            ``results``), e.g. to write transcripts.
        transcripts: a JSONL file that gets one line per answered call
            (:class:`TranscriptWriter`).
    """

    def __init__(
        self,
        policy: ServedPolicy,
        *,
        roles: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        parser: str = "hermes",
        limits: Limits = DEFAULT_LIMITS,
        role_defaults: Mapping[str, Mapping[str, Any]] | None = None,
        window_s: float = 0.01,
        dispatch: Dispatch | None = None,
        episodes: bool = False,
        record: Callable[[str | None, ChatCall, list[GenResult]], None] | None = None,
        transcripts: str | os.PathLike[str] | None = None,
    ) -> None:
        api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
        check_exposure(host, api_key)
        self.policy = policy
        self.batcher = EngineBatcher(getattr(policy, "engine", policy), window_s=window_s, max_requests=getattr(policy, "max_batch", 64))

        self._transcript = TranscriptWriter(transcripts) if transcripts is not None else None

        def plain(episode: str | None, call: ChatCall) -> Any:
            start = time.monotonic()
            fut = self.batcher.submit([call.engine_request()], seed=call.seed)

            def done(f: Any) -> None:
                if f.exception() is not None:
                    return
                if record is not None:
                    record(episode, call, f.result())
                if self._transcript is not None:
                    self._transcript.write(episode, call, f.result(), time.monotonic() - start)

            fut.add_done_callback(done)
            return fut

        app = build_app(policy, dispatch or plain, roles=roles, parser=parser, limits=limits, api_key=api_key,
                        role_defaults=role_defaults, episodes=episodes)
        super().__init__(app, host, port)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server, then the batcher."""
        super().stop(timeout)
        self.batcher.close(timeout)
