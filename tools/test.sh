#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test.
#   tools/test.sh [preset]     (release by default; debug and asan also exist)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
preset="${1:-release}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
