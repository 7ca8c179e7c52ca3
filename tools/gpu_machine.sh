#!/usr/bin/env bash
# The GPU machine's script: tests and comparison of the CUDA variants on an NVIDIA GPU,
# and of the AVX-512 variants on that machine's CPU when it has AVX-512.
#
# That machine has the CUDA driver and PyTorch but no Halide, no toolchain of ours and no
# network, and a command there may run 10 minutes at most. So the build is made here and
# carried, and the work is split into steps that each fit:
#
#   tools/gpu_machine.sh pack          here: builds build/gpu (CUDA, AVX-512 and the AVX2
#                                      variants they are compared with) and packs the
#                                      stripped test and benchmark programs with the shared
#                                      libraries they need into build/gpu-carry.tar.xz
#                                      (about 10 MiB: carry it; the steps below unpack it)
#   tools/gpu_machine.sh machine       there: the GPU, its driver and the host CPU
#   tools/gpu_machine.sh test [SCOPE]  there: every CUDA variant against the reference
#                                      (GPU runtime tests, device memory, long context;
#                                      SCOPE cuda), every AVX-512 variant if the CPU has
#                                      AVX-512 (SCOPE avx512), or both (all, the default)
#   tools/gpu_machine.sh python        there: the Python package on CUDA tensors against torch
#                                      and timed beside it (tools/gpu_python_check.py), if
#                                      that machine's python3 is the version it was built for
#   tools/gpu_machine.sh bundles       here: the GPU autotuner's candidates (tools/gpu_autotune.py
#                                      bundle) for every function of the cuda ISA, compiled and
#                                      assembled, packed as build/gpu-tune/cuda/<function>.tar.xz
#                                      (carry build/gpu-tune beside the archive above)
#   tools/gpu_machine.sh tune FUNCTION...  there: each function's candidates checked and timed
#                                      (tools/gpu_autotune.py measure): generated/results/gpu/tune/;
#                                      back here, tools/gpu_machine.sh freeze makes autotuned_cuda
#   tools/gpu_machine.sh freeze        here: every measured function's winners frozen
#                                      (tools/gpu_autotune.py freeze) into generated/tuned/cuda/
#   tools/gpu_machine.sh campaign      here: the steps a session lent a GPU runs, in order,
#                                      each one command of the device tool (run them first)
#   tools/gpu_machine.sh bench PART    there: the interleaved comparison, PART one of
#                                      layer-short (fused layer, S <= 512), layer-long
#                                      (S >= 2048), stages (each stage alone), core (the
#                                      attention core alone beside PyTorch's SDPA, every
#                                      length), cpu (the AVX-512 variants beside AVX2 and
#                                      the CPU peers)
#
# Results go to generated/results/gpu/ (or --out DIR, given first): machine.txt, test logs,
# and each part's comparison.{json,md}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=generated/results/gpu
if [[ "${1:-}" == "--out" ]]; then out="$2"; shift 2; fi
step="${1:-}"
shift || true
carry=build/gpu-carry
mkdir -p "$out"

# The variants built for that machine: the CUDA ones, the AVX-512 ones and the AVX2 ones
# they are ranked against.
variants='^(manual|autotuned)_avx2$|_avx512_|_cuda$'

has_avx512() { grep -qw avx512f /proc/cpuinfo; }

# The campaign, in order: "command|minutes at most|what it gives". The 2026-11-23 run took
# under a minute per test scope and one to two per comparison at --min-time 0.05; these
# give each step room (a device call stops at 10 minutes) and together need under 40.
# Between the tuning and the comparisons, here: tools/gpu_machine.sh freeze, then pack again
# (the build then has autotuned_cuda), carrying the new archive to the steps after.
campaign=(
  "machine|1|the GPU, driver and host CPU: machine.txt"
  "test cuda|3|every CUDA variant against the reference: tests-cuda.log"
  "tune attention_layer|8|the fused layer's candidates checked and timed: tune/attention_layer/"
  "tune qkv_projection attention_scores masked_softmax weighted_sum output_layernorm|4|the stages' candidates: tune/<function>/"
  "bench layer-short --rounds 7 --min-time 0.1|4|(after freeze and pack here) the fused layer at S <= 512 beside PyTorch eager, SDPA and the cuBLAS roofline"
  "bench layer-long --rounds 7 --min-time 0.1|4|the fused layer at S = 2048 to 8192"
  "bench core --rounds 7 --min-time 0.1|3|the attention core beside SDPA, every length"
  "python|2|the Python package on CUDA tensors, checked and timed beside torch: python.log"
  "test avx512|3|every AVX-512 variant on the host CPU (skipped without AVX-512): tests-avx512.log"
  "bench cpu --rounds 7 --min-time 0.2|5|the AVX-512 variants beside AVX2, OpenBLAS, PyTorch and ONNX Runtime on every host thread"
)

# OpenBLAS 0.3.21 does not know the newest CPUs (Sapphire Rapids) and falls back to its
# Prescott kernels, which made the roofline of the 2026-11-23 host meaningless: name the
# kernels for the ISA the CPU has, and refuse to compare if Prescott still runs.
openblas_kernels() {
  if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
    if has_avx512; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
  fi
  local config
  config=$(echo list | "$carry/attn_bench" --serve | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["context"]["openblas"])')
  echo "openblas: $config"
  if [[ "$config" == *Prescott* ]]; then
    echo "bench: OpenBLAS runs its Prescott kernels here; set OPENBLAS_CORETYPE to this CPU's" >&2
    exit 1
  fi
}

# There: the carried archive, unpacked once.
if [[ "$step" != pack && ! -d "$carry" && -f build/gpu-carry.tar.xz ]]; then
  tar -C build -xJf build/gpu-carry.tar.xz
fi

case "$step" in
pack)
  source tools/setup.sh
  cmake --preset release -B build/gpu -DATTN_ONLY_VARIANTS="$variants" >/dev/null
  cmake --build build/gpu --target attn_tests attn_bench attn_python_module
  rm -rf "$carry" && mkdir -p "$carry/lib" "$carry/python/attn"
  for program in tests/attn_tests bench/attn_bench; do
    strip -o "$carry/$(basename "$program")" "build/gpu/$program"
  done
  # The Python package (its files, not the build tree's links), and the Python it is for.
  cp -L build/gpu/python/attn/*.py "$carry/python/attn/"
  strip -o "$carry/python/attn/$(basename build/gpu/python/attn/_attn*.so)" build/gpu/python/attn/_attn*.so
  python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' > "$carry/python/VERSION"
  # The shared libraries that an image with only the CUDA driver and PyTorch may lack:
  # every one the programs need outside glibc, the C++ runtime and the loader.
  ldd "$carry/attn_tests" "$carry/attn_bench" | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    while read -r library; do cp -L "$library" "$carry/lib/"; done
  tar -C build -cf - gpu-carry | xz -T0 -6 > build/gpu-carry.tar.xz
  du -h build/gpu-carry.tar.xz
  exit
  ;;
bundles)
  source tools/setup.sh
  cmake --preset release >/dev/null
  cmake --build --preset release --target attn_generators attn_bench
  for function in $(python3 tools/gpu_autotune.py families --isa cuda); do
    # The fused layer's space (96) is sampled: each candidate's CUDA module is JIT-compiled
    # there at its first launch, and the tuning step has 10 minutes.
    limit=0; [[ "$function" == attention_layer ]] && limit=32
    python3 tools/gpu_autotune.py bundle --isa cuda --function "$function" --max-candidates "$limit" \
      --generator build/release/attn_generators --out "build/gpu-tune/cuda/$function"
  done
  du -ch build/gpu-tune/cuda/*.tar.xz | tail -1
  exit
  ;;
freeze)
  source tools/setup.sh
  for results in "$out"/tune/*/measured.json; do
    function=$(basename "$(dirname "$results")")
    python3 tools/gpu_autotune.py freeze --bundle "build/gpu-tune/cuda/$function" --results "$(dirname "$results")"
  done
  exit
  ;;
campaign)
  total=0
  echo "The GPU campaign, in order: each line one command of the device tool, in the repository root,"
  echo "carrying build/gpu-carry.tar.xz and build/gpu-tune (tools/gpu_machine.sh pack and bundles, here, first):"
  for step in "${campaign[@]}"; do
    IFS='|' read -r command minutes what <<< "$step"
    total=$((total + minutes))
    printf '  tools/gpu_machine.sh %-48s # <= %d min: %s\n' "$command" "$minutes" "$what"
  done
  echo "at most $total minutes of device time; between the tune and bench steps, here: tools/gpu_machine.sh freeze,"
  echo "tools/gpu_machine.sh pack (the build now has autotuned_cuda); then commit $out and generated/tuned/cuda"
  exit
  ;;
machine)
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader |
      sed 's/^/gpu: /'
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) threads"
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep '^avx512' | sort | tr '\n' ' ')
    echo "avx512: ${flags:-none}"
    python3 -c 'import torch; print("pytorch:", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || true
  } | tee "$out/machine.txt"
  ;;
test)
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  scope="${1:-all}"
  shift || true
  case "$scope" in
  cuda) filter='*_cuda*:Gpu.*' ;;
  avx512) has_avx512 || { echo "test: this CPU has no AVX-512; its variants cannot run here (skipped)"; exit 0; }
          filter='*avx512*' ;;
  all) filter='*_cuda*:Gpu.*'
       if has_avx512; then filter+=':*avx512*'; else echo "test: this CPU has no AVX-512; its variants are left out"; fi ;;
  *) echo "usage: tools/gpu_machine.sh [--out DIR] test [cuda|avx512|all] [gtest options]" >&2; exit 2 ;;
  esac
  "$carry/attn_tests" --gtest_filter="$filter" --gtest_brief=1 "$@" > "$out/tests-$scope.log" 2>&1 &&
    status=0 || status=$?
  tail -30 "$out/tests-$scope.log"
  exit "$status"
  ;;
python)
  built_for=$(cat "$carry/python/VERSION")
  here=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if [[ "$here" != "$built_for" ]]; then
    echo "python: skipped: this machine's python3 is $here, and the package was built for $built_for" |
      tee "$out/python.log"
    exit 0
  fi
  PYTHONPATH="$carry/python" python3 tools/gpu_python_check.py "$@" 2>&1 | tee "$out/python.log"
  exit "${PIPESTATUS[0]}"
  ;;
tune)
  # Each function's bundle (tools/gpu_machine.sh bundles, carried), unpacked and measured.
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  (($#)) || { echo "usage: tools/gpu_machine.sh [--out DIR] tune FUNCTION..." >&2; exit 2; }
  for function in "$@"; do
    archive="build/gpu-tune/cuda/$function.tar.xz"
    [[ -f "$archive" ]] || { echo "tune: no $archive (tools/gpu_machine.sh bundles here, then carry build/gpu-tune)" >&2; exit 1; }
    rm -rf "build/gpu-tune/there/$function" && mkdir -p build/gpu-tune/there
    tar -C build/gpu-tune/there -xJf "$archive"
    python3 tools/gpu_autotune.py measure --bundle "build/gpu-tune/there/$function" --bench "$carry/attn_bench" \
      --out "$out/tune/$function"
  done
  ;;
bench)
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  openblas_kernels
  part="${1:-}"
  shift || true
  compare=(python3 bench/compare.py --bench "$carry/attn_bench" --out "$out/$part" --no-chart)
  long='_s(2048|4096|8192)_'
  case "$part" in
  layer-short) "${compare[@]}" --device cuda --filter "^attention_layer/" --exclude "$long" "$@" ;;
  layer-long) "${compare[@]}" --device cuda --filter "^attention_layer/.*$long" "$@" ;;
  stages) "${compare[@]}" --device cuda --exclude "^attention_(layer|core)/" "$@" ;;
  core) "${compare[@]}" --device cuda --filter "^attention_core/" "$@" ;;
  cpu)
    has_avx512 || { echo "bench cpu: this CPU has no AVX-512" >&2; exit 1; }
    "${compare[@]}" --device cpu --filter "^attention_layer/" --exclude "$long|/(mullapudi2016|adams2019|li2018)_" "$@"
    ;;
  *) echo "usage: tools/gpu_machine.sh [--out DIR] bench layer-short|layer-long|stages|core|cpu [compare.py options]" >&2
     exit 2 ;;
  esac
  ;;
*)
  echo "usage: tools/gpu_machine.sh [--out DIR] pack|bundles|campaign|machine|test|tune FUNCTION...|python|bench PART|freeze" >&2
  exit 2
  ;;
esac
