"""The FastAPI app: ``GET /v1/models`` and ``POST /v1/chat/completions``, ``model`` = role.

Routes (each also under ``/episodes/{episode}/v1/...`` when a ``dispatch`` that knows
episodes is given, so that every episode of a program env has its own ``base_url``):

* ``GET /v1/models``: the roles, as OpenAI model objects.
* ``POST /v1/chat/completions``: :func:`~marft_algos.serve.protocol.parse_chat_request`,
  then ``dispatch(episode, call)`` (by default the :class:`EngineBatcher`), then the
  reply as JSON or server-sent events (``stream=true``).

Errors are OpenAI-shaped (``{"error": {...}}``): 401 without the API key when one is
set, 404 unknown role (or episode), 400 malformed body or context overflow (with the
sizes), 413 body over the cap, 409 a call into an episode that has ended. The body is
read with a size cap before it is parsed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from marft_algos.models.sampling import GenResult
from marft_algos.protocols import ServedPolicy
from marft_algos.serve.protocol import (
    DEFAULT_LIMITS,
    ChatCall,
    Limits,
    OpenAIError,
    completion_body,
    error_body,
    parse_chat_request,
    stream_chunks,
)
from marft_envs.tools.parsers import ToolCallParser, get_parser

__all__ = ["Dispatch", "build_app"]

#: ``dispatch(episode, call)``: the future of the call's results (``episode`` is None on
#: the plain ``/v1`` routes); raises :class:`OpenAIError` to refuse the call
Dispatch = Callable[[str | None, ChatCall], "Future[list[GenResult]]"]


def _error(err: OpenAIError) -> Any:
    return JSONResponse(error_body(err), status_code=err.status)


async def _read_body(request: Any, cap: int) -> Any:
    """The JSON body, read at most ``cap`` bytes (413 above), 400 when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise OpenAIError(413, f"the request body is {declared} bytes; at most {cap}", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise OpenAIError(413, f"the request body is over {cap} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise OpenAIError(400, "the request body is not valid JSON") from None


def build_app(
    policy: ServedPolicy | None,
    dispatch: Dispatch,
    *,
    roles: Sequence[str] | None = None,
    parser: str | ToolCallParser = "hermes",
    limits: Limits = DEFAULT_LIMITS,
    api_key: str | None = None,
    role_defaults: Mapping[str, Mapping[str, Any]] | None = None,
    episodes: bool = False,
    roles_of: Callable[[str | None], Sequence[str]] | None = None,
    on_refused: Callable[[str | None, OpenAIError], None] | None = None,
    on_reward: Callable[[str, Any], Any] | None = None,
) -> Any:
    """The ASGI app serving ``roles`` (default: all of ``policy.roles``).

    ``policy`` gives each role's tokenizer and context window (``tokenizer(role)``,
    ``max_context(role)``); ``dispatch`` generates (see :data:`Dispatch`); ``api_key``:
    every request must send ``Authorization: Bearer <api_key>``; ``episodes``: also
    serve the ``/episodes/{episode}/v1`` routes. Without a ``policy`` (a program env),
    ``roles_of(episode)`` gives the roles of each episode (raising :class:`OpenAIError` for
    an unknown one) and prompts are not encoded here; ``on_refused(episode, error)`` hears
    of every refused request; ``on_reward(episode, body)`` answers
    ``POST /episodes/{episode}/v1/reward`` (reward components posted by the program).
    """
    if policy is None and roles_of is None:
        raise ValueError("build_app needs a policy or roles_of")
    served = list(roles if roles is not None else (policy.roles if policy is not None else []))
    unknown = [r for r in served if policy is not None and r not in policy.roles]
    if unknown:
        raise ValueError(f"roles {unknown} are not roles of the policy {list(policy.roles)}")
    tool_parser = get_parser(parser)
    created = int(time.time())
    app = FastAPI(title="marft team endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.roles = served

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Any:
        if api_key is not None:
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {api_key}".encode()):
                return _error(OpenAIError(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                                          code="invalid_api_key", type_="authentication_error"))
        return await call_next(request)

    def models(episode: str | None) -> Any:
        names = roles_of(episode) if roles_of is not None else served
        return {"object": "list", "data": [{"id": r, "object": "model", "created": created, "owned_by": "marft"} for r in names]}

    async def chat(request: Request, episode: str | None) -> Any:
        try:
            body = await _read_body(request, limits.max_body_bytes)
            names = roles_of(episode) if roles_of is not None else served
            call = parse_chat_request(
                body, roles=names, tokenizer_of=policy.tokenizer if policy is not None else None,
                max_context_of=policy.max_context if policy is not None else None,
                parser=tool_parser, limits=limits, role_defaults=role_defaults,
            )
            results = await asyncio.wrap_future(dispatch(episode, call))
        except OpenAIError as e:
            if on_refused is not None:
                on_refused(episode, e)
            return _error(e)
        except Exception as e:  # an engine failure: an OpenAI-shaped 500, the server goes on
            return _error(OpenAIError(500, f"generation failed: {type(e).__name__}: {e}", type_="server_error"))
        tok = policy.tokenizer(call.role) if policy is not None else None
        if call.stream:
            return StreamingResponse(stream_chunks(call, results, tool_parser, tok), media_type="text/event-stream")
        return JSONResponse(completion_body(call, results, tool_parser, tok))

    @app.get("/v1/models")
    async def list_models() -> Any:
        try:
            return models(None)
        except OpenAIError as e:
            return _error(e)

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        return await chat(request, None)

    if episodes:
        @app.get("/episodes/{episode}/v1/models")
        async def episode_models(episode: str) -> Any:
            try:
                return models(episode)
            except OpenAIError as e:
                return _error(e)

        @app.post("/episodes/{episode}/v1/chat/completions")
        async def episode_completions(episode: str, request: Request) -> Any:
            return await chat(request, episode)

        if on_reward is not None:
            @app.post("/episodes/{episode}/v1/reward")
            async def episode_reward(episode: str, request: Request) -> Any:
                try:
                    return on_reward(episode, await _read_body(request, limits.max_body_bytes))
                except OpenAIError as e:
                    return _error(e)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Any) -> Any:
        return JSONResponse(error_body(OpenAIError(404, f"no route {request.url.path}", code="not_found")), status_code=404)

    return app
