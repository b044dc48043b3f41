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
# One worker per core, each test file whole on one worker (its fixtures and module state stay
# together); one torch/OpenMP thread per worker so the workers do not fight over the cores.
# MARFT_TEST_WORKERS=0 runs in this process (no xdist). The slowest tests are listed at the end.
N="$(nproc)"; WORKERS="${MARFT_TEST_WORKERS:-$(( N < 4 ? N : 4 ))}"  # at most 4: each worker holds models
PAR=()
if [ "$WORKERS" != "0" ]; then
  PAR=(-n "$WORKERS" --dist loadfile)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
exec python -m pytest -m "$MARK" "${PAR[@]}" --durations=25 "$@"
