#!/usr/bin/env bash
# Sets up the environment and runs the test suite. In CI (CI=true) slow tests are skipped.
# Extra arguments go to pytest. pytest's exit status (5 = no tests collected) is passed through.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
export MARFT_DATA_DIR="${MARFT_DATA_DIR:-$ROOT/../shared/data}"
ruff check marft_envs marft_algos tests benchmarks
MARK="not slow"
if [ "${MARFT_SLOW:-0}" = "1" ]; then MARK=""; fi
SITE="$(mktemp -d)" && python -m mkdocs build --strict -d "$SITE" && rm -rf "$SITE"  # docs; no -q: it disables --strict
exec python -m pytest -m "$MARK" "$@"
