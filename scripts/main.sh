#!/usr/bin/env bash
# The main job: sets up the environment, then runs a short MARFT training run of a
# reasoner -> actor duo on arith-duo-v0 with the offline default model (SmolLM2-135M),
# with a progress bar, ending in a result table (untrained vs trained) and a plot.
# Extra arguments go to `marft quickstart` (e.g. --minutes 5 --out runs/mine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec marft quickstart "$@"
