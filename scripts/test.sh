#!/usr/bin/env bash
# The README's test command: installs what a fresh machine lacks
# (scripts/install-deps.sh), then runs every test of the workspace.
# Extra arguments go to `cargo nextest run` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec cargo nextest run --workspace --no-fail-fast "$@"
