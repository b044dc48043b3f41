"""An OpenAI-compatible endpoint per role: ``model`` is the team role (``docs/programs.md``).

* :class:`TeamServer`: a ``TeamPolicy`` behind ``/v1/models`` and ``/v1/chat/completions``
  on a real HTTP server (FastAPI + uvicorn) in a thread of this process.
* :class:`EngineBatcher`: concurrent requests generated in one engine call.
* :mod:`marft_algos.serve.protocol`: the wire format (requests, replies, errors).
* ``marft serve`` (:mod:`marft_algos.serve.cli`).
"""

from marft_algos.serve.batcher import EngineBatcher
from marft_algos.serve.protocol import ChatCall, Limits, OpenAIError, parse_chat_request
from marft_algos.serve.server import API_KEY_ENV, LoopbackServer, TeamServer, check_exposure

__all__ = [
    "API_KEY_ENV",
    "ChatCall",
    "EngineBatcher",
    "Limits",
    "LoopbackServer",
    "OpenAIError",
    "TeamServer",
    "check_exposure",
    "parse_chat_request",
]
