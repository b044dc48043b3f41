"""Models and the team policy: base-model loading (aliases, GGUF cache), the tiny test
model, per-role LoRA adapters on one shared base (:class:`TeamPolicy`), the public token
:class:`Layout` and the critic (:class:`ValueModel`). Sampling runs in a generation
engine (:mod:`marft_algos.engines`).

See ``docs/design/contracts.md`` section 2 for the contract other packages rely on.
"""

from marft_algos.models.aliases import ALIASES, ModelAlias, UnknownModelError, resolve_alias
from marft_algos.models.chat import encode_chat, special_strings_in
from marft_algos.models.layout import Layout, build_layout
from marft_algos.models.loading import (
    IntegrityError,
    MissingPackageError,
    cache_root,
    load_base,
    parse_dtype,
)
from marft_algos.models.policy import LoadedBase, LoraSettings, TeamPolicy
from marft_algos.models.sampling import (
    FinishReason,
    GenRequest,
    GenResult,
    SamplingParams,
    TokenStats,
)
from marft_algos.models.tiny import build_tiny_model, build_tiny_tokenizer
from marft_algos.models.value import ValueHead, ValueModel

__all__ = [
    "ALIASES",
    "FinishReason",
    "GenRequest",
    "GenResult",
    "IntegrityError",
    "Layout",
    "LoadedBase",
    "LoraSettings",
    "MissingPackageError",
    "ModelAlias",
    "SamplingParams",
    "TeamPolicy",
    "TokenStats",
    "UnknownModelError",
    "ValueHead",
    "ValueModel",
    "build_layout",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "encode_chat",
    "cache_root",
    "load_base",
    "parse_dtype",
    "resolve_alias",
    "special_strings_in",
]
