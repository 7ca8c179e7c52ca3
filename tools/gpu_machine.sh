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
#   tools/gpu_machine.sh pack-baseline REV
#                                      here: REV's hand-written and tuned CUDA variants built in
#                                      a worktree, their attn_bench stripped into
#                                      build/gpu-baseline.tar.xz (carry it beside the archive
#                                      above), so that a comparison there pairs a change with
#                                      the code before it: the bench step's GPU parts then
#                                      time its cases too (<impl>@baseline)
#   tools/gpu_machine.sh machine       there: the GPU, its driver and the host CPU
#   tools/gpu_machine.sh test [SCOPE]  there: every CUDA variant against the reference
#                                      (GPU runtime tests, device memory, long context;
#                                      SCOPE cuda), every AVX-512 variant if the CPU has
#                                      AVX-512 (SCOPE avx512), or both (all, the default)
#   tools/gpu_machine.sh python        there: the Python package on CUDA tensors against torch
#                                      and timed beside it (tools/gpu_python_check.py), if
#                                      that machine's python3 is the version it was built for
#   tools/gpu_machine.sh bundles [ISA] here: the GPU autotuner's candidates (tools/gpu_autotune.py
#                                      bundle) for every function of the ISA (cuda, or the host
#                                      CPU's avx512_skylake), compiled (and assembled), packed as
#                                      build/gpu-tune/ISA/<function>.tar.xz, all of them in
#                                      build/gpu-tune.tar (carry it beside the archive above)
#   tools/gpu_machine.sh tune [--isa ISA] FUNCTION...  there: each function's candidates checked
#                                      and timed (tools/gpu_autotune.py measure):
#                                      generated/results/gpu/tune/ (tune-ISA/ for a host CPU ISA);
#                                      back here, tools/gpu_machine.sh freeze makes autotuned_<ISA>
#   tools/gpu_machine.sh freeze [ISA]  here: the ISA's (default cuda) measured winners frozen
#                                      (tools/gpu_autotune.py freeze) into generated/tuned/ISA/
#   tools/gpu_machine.sh campaign      here: the device calls a session lent a GPU makes, in
#                                      order (run them first)
#   tools/gpu_machine.sh call N        there: campaign call N, its steps in order within its
#                                      minutes, the results packed into $OUT (the device tool's)
#   tools/gpu_machine.sh profile       there: where the host CPU's time goes, by Halide Func,
#                                      at 1 to all its threads (tools/halide_profile.py, the
#                                      hand-written AVX-512 layers at B=1 S=128, from a
#                                      build with Halide's profiler that pack makes too)
#   tools/gpu_machine.sh trace [REGEX] there: where each CUDA call's time goes, kernel by
#                                      kernel, and what the host does around the kernels: each
#                                      case (default $traced) run alone by attn_bench under the
#                                      CUPTI tracer (bench/kernel_trace.cpp), summarized by
#                                      tools/gpu_trace.py into trace/trace.md
#   tools/gpu_machine.sh ncu [REGEX]   there: Nsight Compute's counters (speed of light, memory,
#                                      occupancy, warp stalls) on a few kernels of each case
#                                      (default $profiled_kernels: the packed and padded batch's Q
#                                      projection, the flash core short and long), one
#                                      attn_bench process per case: ncu/<case>.txt
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
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"  # for `call`'s steps
cd "$(dirname "$self")/.."
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

# The variants the profile step runs (with their bf16 and int8 layers), and where.
profiled='^manual_(avx512_skylake|avx512_zen4|avx512_sapphirerapids)$'
profile_filter='^attention_layer/manual_avx512_(skylake|zen4|sapphirerapids)(_bf16|_int8)?/b1_s128_h768_n12$'

# The campaign: the device calls, in order, each "minutes|step;step;...|what it gives". A
# session is lent 15 minutes of device time, and each machine start costs one to two, so
# the steps share few calls. `call N` gives each step what is left of the call's minutes
# (a step cut short loses only its own results) and packs everything into
# $OUT/gpu-results.tar.xz. Call 1 took 7.5 minutes on an H200 on 2026-11-26 (tests 32 s,
# the layer's tuning 206 s, the stages' 164 s, the AVX-512 tests 39 s); call 2 about 2.5;
# the first start about half a minute. Between calls 1 and 2, here: tools/gpu_machine.sh
# freeze, then pack (the build gains autotuned_cuda). Call 3 took 7 min 8 s on 2026-11-27
# (profile 29 s, the layer's tuning 260 s, the stages' about 135 s); after it, freeze
# avx512_skylake and pack here (about 10 minutes on 2 cores) before a call that times
# autotuned_avx512_skylake: the machine goes back after 30 s idle, so that call starts a
# fresh one. All three calls have run (1 and 2 on 2026-11-26, 3 on 2026-11-27): a later
# loan reruns call 1 and 2 once the CUDA schedules change, and call 3 (bundles again
# first) once the CPU ones do. On 2026-11-27 a loan of 15 minutes ran the trace step and
# the layer and core comparisons (4 min), then the comparisons and the layer's tuning after
# the flash core changed (7 min, 40 candidates). On 2026-11-28 an H100 ran the machine step,
# the CUDA tests (45 s), 16 candidates of the layer beside the peers (107 s), ncu (22 s), the
# core and the host CPU (33 s each), then the layer at every length (49 s): 5.7 minutes held
# with the start; a third call was refused (loans paused). On 2026-11-29 (an H200, 15 minutes)
# three calls: the AVX-512 tests and the host CPU at 1-16 threads with bf16 and int8 (4 min);
# the layer's 32 CUDA candidates and the CUDA tests (3.5 min); after freeze and pack here, the
# layer and the core beside PyTorch and a profile (2 min); 11 minutes held with the starts.
campaign=(
  "9|machine;test cuda;tune attention_layer;tune attention_scores masked_softmax weighted_sum qkv_projection output_layernorm;test avx512|the GPU, driver and host CPU; every CUDA variant against the reference; every function's candidates checked and timed, the fused layer's beside PyTorch eager, SDPA and the cuBLAS roofline (tune/); every AVX-512 variant on the host CPU"
  "6|bench layer;bench core;bench stages;bench cpu;python;ncu;trace|(after freeze and pack here) the hand-written and tuned CUDA variants beside PyTorch and cuBLAS: the fused layer at every length, the core, the stages; the host CPU's AVX-512 variants beside ONNX Runtime and PyTorch; the Python package on CUDA tensors; Nsight Compute's counters on the packed and padded projections and the flash core (ncu/); each CUDA call's time kernel by kernel and the host's around it (trace/)"
  "9|profile;tune --isa avx512_skylake attention_layer;tune --isa avx512_skylake attention_scores masked_softmax weighted_sum qkv_projection output_layernorm|(needs tools/gpu_machine.sh bundles avx512_skylake here; the next session's first call if this one has no minutes left) where the host CPU's time goes at 1 to all its threads (profile/); the host CPU's candidates checked and timed on all its threads, the fused layer's beside ONNX Runtime and PyTorch (tune-avx512_skylake/): freeze then makes autotuned_avx512_skylake"
)
# What a GPU comparison times: the hand-written and tuned CUDA variants and the peers (the
# autoscheduled ones took 1.6-8x manual_cuda's time on an H100; bench ... --filter REGEX
# names others).
compared='(manual_cuda|autotuned_cuda|pytorch_eager|pytorch_sdpa|pytorch_sdpa_bf16|cublas_roofline)'
# What the trace step traces: the fused layer short, padded, packed (its packed batch took 4.3x
# the padded one's time on the H200 of 2026-11-26, unexplained) and long, the core long.
traced='^attention_layer/(manual|autotuned)_cuda/(b1_s128_h768_n12|b8_s128_h768_n12_pad|b8_s128_h768_n12_varlen|b32_s384_h768_n12_varlen|b1_s2048_h768_n12)$|^attention_core/manual_cuda/b1_s2048_h768_n12$'

# What the ncu step profiles: the packed B=8 S=128 batch's projections took 5.7x the padded
# batch's time each on the H200 of 2026-11-27 with the same PTX (the trace step), and the flash
# core is 75% of the layer at S=2048; ncu_kernels names the kernels (Q's projection, the core).
profiled_kernels='^attention_layer/manual_cuda/(b8_s128_h768_n12_pad|b8_s128_h768_n12_varlen)$|^attention_core/manual_cuda/(b1_s384_h768_n12|b1_s2048_h768_n12)$'
ncu_kernels='regex:_kernel_(q_s0_batch|block_result_s0)'

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

# There: each carried archive, unpacked once, unless this step is the one that makes it here.
# A warm machine keeps what an earlier call unpacked: a newer archive (pack again between
# calls) is unpacked again; the stamp says when the last one was. unpack_carried ARCHIVE
# MAKER [FOLDER]: FOLDER (what the archive holds) is emptied first, where given.
unpack_carried() {
  local archive="$1" maker="$2" folder="${3:-}" stamp
  stamp="build/.$(basename "${1%%.tar*}").unpacked"
  [[ "$step" != "$maker" && -f "$archive" && "$archive" -nt "$stamp" ]] || return 0
  [[ -z "$folder" ]] || rm -rf "$folder"
  tar -C build -xf "$archive" && touch "$stamp"
}
unpack_carried build/gpu-carry.tar.xz pack "$carry"
unpack_carried build/gpu-baseline.tar.xz pack-baseline build/gpu-baseline
# (Here build/gpu-tune also holds the bundles' folders: it is not emptied.)
unpack_carried build/gpu-tune.tar bundles

case "$step" in
pack)
  source tools/setup.sh
  cmake --preset release -B build/gpu -DATTN_ONLY_VARIANTS="$variants" >/dev/null
  cmake --build build/gpu --target attn_tests attn_bench attn_python_module
  rm -rf "$carry" && mkdir -p "$carry/lib" "$carry/python/attn"
  for program in tests/attn_tests bench/attn_bench; do
    strip -o "$carry/$(basename "$program")" "build/gpu/$program"
  done
  # The CUPTI tracer (the trace step), beside the libcupti it was built with (ldd below),
  # where the CUDA toolkit here has CUPTI.
  tracer=()
  if cmake --build build/gpu --target attn_kernel_trace 2>/dev/null; then
    strip -o "$carry/lib/libattn_kernel_trace.so" build/gpu/bench/libattn_kernel_trace.so
    tracer=("$carry/lib/libattn_kernel_trace.so")
  else
    echo "pack: no CUPTI in this CUDA toolkit: the trace step will have no tracer" >&2
  fi
  # The benchmark worker again with Halide's profiler in its CPU kernels (the profile step).
  cmake --preset release -B build/gpu-profile -DATTN_PROFILE=ON -DATTN_ONLY_VARIANTS="$profiled" \
    -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_PYTHON=OFF >/dev/null
  cmake --build build/gpu-profile --target attn_bench
  strip -o "$carry/attn_bench_profile" build/gpu-profile/bench/attn_bench
  # The Python package (its files, not the build tree's links), and the Python it is for.
  cp -L build/gpu/python/attn/*.py "$carry/python/attn/"
  strip -o "$carry/python/attn/$(basename build/gpu/python/attn/_attn*.so)" build/gpu/python/attn/_attn*.so
  python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' > "$carry/python/VERSION"
  # The shared libraries that an image with only the CUDA driver and PyTorch may lack:
  # every one the programs need outside glibc, the C++ runtime and the loader.
  ldd "$carry/attn_tests" "$carry/attn_bench" "${tracer[@]}" | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    while read -r library; do cp -L "$library" "$carry/lib/"; done
  tar -C build -cf - gpu-carry | xz -T0 -6 > build/gpu-carry.tar.xz
  du -h build/gpu-carry.tar.xz
  exit
  ;;
pack-baseline)
  # (manual_sse41 too: attn_bench starts only where a variant runs on the CPU.) The libraries
  # it needs are the carried archive's (the same toolchain): run it there with
  # build/gpu-carry/lib on LD_LIBRARY_PATH, as the steps below do.
  rev="${1:?usage: tools/gpu_machine.sh pack-baseline REV (a commit, branch or tag)}"
  commit=$(git rev-parse --verify "$rev^{commit}")
  source tools/setup.sh
  tree="$PWD/build/gpu-baseline-src" built="$PWD/build/gpu-baseline-build"
  git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git worktree add --detach "$tree" "$commit" >/dev/null
  ln -s "$PWD/.venv" "$tree/.venv"  # the same pinned toolchain
  (cd "$tree" && cmake --preset release -B "$built" -DATTN_ONLY_VARIANTS='^(manual|autotuned)_cuda$|^manual_sse41$' \
    -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_PYTHON=OFF >/dev/null)
  cmake --build "$built" --target attn_bench
  rm -rf build/gpu-baseline && mkdir -p build/gpu-baseline
  strip -o build/gpu-baseline/attn_bench "$built/bench/attn_bench"
  echo "$commit" > build/gpu-baseline/COMMIT
  git worktree remove --force "$tree"
  tar -C build -cJf build/gpu-baseline.tar.xz gpu-baseline
  du -h build/gpu-baseline.tar.xz
  exit
  ;;
bundles)
  isa="${1:-cuda}"
  source tools/setup.sh
  cmake --preset release >/dev/null
  cmake --build --preset release --target attn_generators attn_bench
  for function in $(python3 tools/gpu_autotune.py families --isa "$isa"); do
    # Large spaces are sampled: the fused layer's CUDA space (3,888; each candidate's module
    # is JIT-compiled there at its first launch), each projection stage's (324; the other
    # stages have one candidate) and the CPU ones (2256 for the layer, up to 192 for a
    # stage), so that each tuning step fits its share of a device call (call 1 on 2026-11-26:
    # 206 s for the layer's sample, 164 s for the stages'; call 3: about 4 minutes
    # for the layer's 16 beside the peers, 2.5 for the stages'). Each CUDA sample times every
    # change of a single parameter beside the default (gpu_autotune.py search_space; a CPU
    # sample has half its candidates such changes).
    if [[ "$isa" == cuda ]]; then limit=32
    else limit=8; [[ "$function" == attention_layer ]] && limit=16; fi
    python3 tools/gpu_autotune.py bundle --isa "$isa" --function "$function" --max-candidates "$limit" \
      --generator build/release/attn_generators --out "build/gpu-tune/$isa/$function"
  done
  # Every ISA's archives in one file to carry (a device call carries at most 8 paths; the
  # bundles' folders beside the archives are too large to carry).
  (cd build && tar -cf gpu-tune.tar gpu-tune/*/*.tar.xz)
  du -h build/gpu-tune.tar
  exit
  ;;
freeze)
  # One ISA's measurements (tune/ holds the CUDA ones, tune-<isa>/ a host CPU ISA's): those
  # of an ISA frozen before are of an older bundle, which freeze refuses.
  isa="${1:-cuda}" results="$out/tune"
  [[ "$isa" == cuda ]] || results="$out/tune-$isa"
  source tools/setup.sh
  for measured in "$results"/*/measured.json; do
    [[ -f "$measured" ]] || { echo "freeze: no measurements in $results" >&2; exit 1; }
    function=$(basename "$(dirname "$measured")")
    python3 tools/gpu_autotune.py freeze --bundle "build/gpu-tune/$isa/$function" --results "$(dirname "$measured")"
  done
  exit
  ;;
campaign)
  total=0 n=0
  echo "The GPU campaign: each call one command of the device tool, in the repository root, carrying"
  echo "build/gpu-carry.tar.xz and build/gpu-tune.tar (tools/gpu_machine.sh pack and bundles [ISA], here, first);"
  echo "unpack \$OUT/gpu-results.tar.xz into $out here after each:"
  for entry in "${campaign[@]}"; do
    IFS='|' read -r minutes steps what <<< "$entry"
    total=$((total + minutes)) n=$((n + 1))
    printf '  tools/gpu_machine.sh call %d   # <= %d min: %s\n      (%s)\n' "$n" "$minutes" "$steps" "$what"
  done
  echo "at most $total minutes of device time (a session has 15: calls left over open the next lent session);"
  echo "between calls 1 and 2, here: tools/gpu_machine.sh freeze, tools/gpu_machine.sh pack; after call 3,"
  echo "tools/gpu_machine.sh freeze avx512_skylake; then commit $out and generated/tuned/"
  exit
  ;;
call)
  n="${1:-}"
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le ${#campaign[@]} ]] ||
    { echo "usage: tools/gpu_machine.sh [--out DIR] call 1..${#campaign[@]}" >&2; exit 2; }
  IFS='|' read -r minutes steps what <<< "${campaign[n - 1]}"
  deadline=$((SECONDS + minutes * 60 - 20))  # 20 s left to pack the results
  IFS=';' read -ra list <<< "$steps"
  failed=0
  for step in "${list[@]}"; do
    left=$((deadline - SECONDS))
    if ((left < 15)); then echo "=== $step: skipped, the call's $minutes minutes are spent"; failed=1; continue; fi
    echo "=== $step (at most $left s)"
    # shellcheck disable=SC2086  # a step is words
    timeout -k 10 "$left" "$self" --out "$out" $step > "$out/step.log" 2>&1 && status=0 || status=$?
    cat "$out/step.log" >> "$out/call-$n.log"
    tail -4 "$out/step.log"
    echo "=== $step: exit $status"
    ((status == 0)) || failed=1
  done
  rm -f "$out/step.log"
  if [[ -n "${OUT:-}" ]]; then
    if tar -C "$out" -cJf "$OUT/gpu-results.tar.xz" .; then echo "results: \$OUT/gpu-results.tar.xz"; else failed=1; fi
  fi
  exit "$failed"
  ;;
machine)
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader |
      sed 's/^/gpu: /'
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) threads"
    # Family and model tell a VM's CPUs apart (dispatch keys on them); threads per core say
    # whether 16 threads are 16 cores' FMA units or 8 cores' shared by hyperthreads.
    echo "cpu id: family $(grep -m1 '^cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
    lscpu 2>/dev/null | grep -E '^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)|L2 cache|L3 cache):' | sed 's/^/cpu topology: /' || true
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
  isa=cuda results="$out/tune"
  if [[ "${1:-}" == --isa ]]; then
    (($# >= 2)) || { echo "usage: tools/gpu_machine.sh [--out DIR] tune [--isa ISA] FUNCTION..." >&2; exit 2; }
    isa="$2" results="$out/tune-$2"; shift 2
  fi
  (($#)) || { echo "usage: tools/gpu_machine.sh [--out DIR] tune [--isa ISA] FUNCTION..." >&2; exit 2; }
  for function in "$@"; do
    archive="build/gpu-tune/$isa/$function.tar.xz"
    [[ -f "$archive" ]] || { echo "tune: no $archive (tools/gpu_machine.sh bundles here, then carry build/gpu-tune)" >&2; exit 1; }
    rm -rf "build/gpu-tune/there/$function" && mkdir -p build/gpu-tune/there
    tar -C build/gpu-tune/there -xJf "$archive"
    # The fused layer's candidates are timed beside the peers in the same rounds, so the
    # winner's ratios to them are paired: on a GPU PyTorch's (eager, SDPA) and the cuBLAS
    # roofline, on the host CPU ONNX Runtime's and PyTorch's.
    peers=()
    if [[ "$function" == attention_layer ]]; then
      if [[ "$isa" == cuda ]]; then peers=(--peers 'pytorch_eager|pytorch_sdpa|cublas_roofline')
      else openblas_kernels; peers=(--peers 'onnxruntime|pytorch'); fi
    fi
    python3 tools/gpu_autotune.py measure --bundle "build/gpu-tune/there/$function" --bench "$carry/attn_bench" \
      --out "$results/$function" ${peers[@]+"${peers[@]}"}
  done
  ;;
profile)
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  has_avx512 || { echo "profile: this CPU has no AVX-512; its variants cannot run here (skipped)"; exit 0; }
  counts=(1) n=2
  while ((n < $(nproc))); do counts+=("$n"); n=$((n * 2)); done
  counts+=("$(nproc)")
  python3 tools/halide_profile.py --bench "$carry/attn_bench_profile" --filter "$profile_filter" --threads "${counts[@]}" \
    --min-time 0.3 --out "$out/profile" "$@"
  ;;
trace)
  # One attn_bench process per case, so that a trace holds one case's calls: the driver loads
  # the tracer named by CUDA_INJECTION64_PATH when the process initializes CUDA.
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  filter="${1:-$traced}"
  tracer="$PWD/$carry/lib/libattn_kernel_trace.so"
  [[ -f "$tracer" ]] || { echo "trace: no $tracer (tools/gpu_machine.sh pack, with CUPTI, then carry it)" >&2; exit 1; }
  rm -rf "$out/trace" && mkdir -p "$out/trace"
  traces="$(realpath "$out/trace")"
  mapfile -t cases < <("$carry/attn_bench" --benchmark_list_tests --benchmark_filter="$filter")
  ((${#cases[@]})) || { echo "trace: no case matches $filter" >&2; exit 1; }
  for case in "${cases[@]}"; do
    file="$traces/${case//\//__}"
    # (A case that hangs loses only itself: 60 s each, a few seconds when all is well.)
    CUDA_INJECTION64_PATH="$tracer" ATTN_KERNEL_TRACE="$file.jsonl" timeout -k 5 60 \
      "$carry/attn_bench" --benchmark_filter="^$case\$" --benchmark_min_time=0.2 \
      --benchmark_out="$file.bench.json" --benchmark_out_format=json > "$file.log" 2>&1 ||
      { echo "trace: $case failed:"; tail -5 "$file.log"; }
  done
  python3 tools/gpu_trace.py "$out/trace" && status=0 || status=$?
  xz -T0 -f "$out"/trace/*.jsonl 2>/dev/null || true  # the raw records, a few MB each, kept compressed
  exit "$status"
  ;;
ncu)
  # Each case alone, its matching kernels profiled once after two calls' worth of launches
  # (the first call JIT-compiles), at the GPU's own clocks (--clock-control none: the counters
  # of a kernel as the benchmark runs it).
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  filter="${1:-$profiled_kernels}"
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
  [[ -n "$ncu" ]] || { echo "ncu: Nsight Compute is not on this machine" >&2; exit 1; }
  rm -rf "$out/ncu" && mkdir -p "$out/ncu"
  mapfile -t cases < <("$carry/attn_bench" --benchmark_list_tests --benchmark_filter="$filter")
  ((${#cases[@]})) || { echo "ncu: no case matches $filter" >&2; exit 1; }
  for case in "${cases[@]}"; do
    file="$out/ncu/${case//\//__}.txt"
    timeout -k 5 120 "$ncu" --clock-control none -k "$ncu_kernels" --launch-skip 4 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      "$carry/attn_bench" --benchmark_filter="^$case\$" --benchmark_min_time=0.05 > "$file" 2>&1 ||
      { echo "ncu: $case failed:"; tail -5 "$file"; }
  done
  grep -h -E '^  [a-z_].*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Issued Ipc' "$out"/ncu/*.txt | head -120
  ;;
bench)
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  openblas_kernels
  part="${1:-}"
  shift || true
  compare=(python3 bench/compare.py --bench "$carry/attn_bench" --out "$out/$part" --no-chart)
  # Short samples: a GPU call takes microseconds to milliseconds, and the device time is scarce.
  gpu=(--device cuda --rounds 7 --min-time 0.05 --pause 0.02)
  # A carried baseline build (pack-baseline) is timed beside this one in every GPU part.
  [[ -x build/gpu-baseline/attn_bench ]] && gpu+=(--baseline build/gpu-baseline/attn_bench)
  long='_s(2048|4096|8192)_'
  case "$part" in
  layer) "${compare[@]}" "${gpu[@]}" --filter "^attention_layer/$compared/" "$@" ;;
  layer-short) "${compare[@]}" "${gpu[@]}" --filter "^attention_layer/$compared/" --exclude "$long" "$@" ;;
  layer-long) "${compare[@]}" "${gpu[@]}" --filter "^attention_layer/$compared/.*$long" "$@" ;;
  stages) "${compare[@]}" "${gpu[@]}" --filter "^[a-z_]+/$compared/" --exclude "^attention_(layer|core)/" "$@" ;;
  core) "${compare[@]}" "${gpu[@]}" --filter "^attention_core/$compared/" "$@" ;;
  cpu)
    has_avx512 || { echo "bench cpu: this CPU has no AVX-512" >&2; exit 1; }
    "${compare[@]}" --device cpu --rounds 5 --min-time 0.1 --pause 0.05 --filter "^attention_layer/" \
      --exclude "$long|/(mullapudi2016|adams2019|li2018)_" "$@"
    ;;
  *) echo "usage: tools/gpu_machine.sh [--out DIR] bench layer|layer-short|layer-long|stages|core|cpu [compare.py options]" >&2
     exit 2 ;;
  esac
  ;;
*)
  echo "usage: tools/gpu_machine.sh [--out DIR] pack|pack-baseline REV|bundles [ISA]|campaign|call N|machine|test|tune [--isa ISA] FUNCTION...|python|profile|trace [REGEX]|ncu [REGEX]|bench PART|freeze [ISA]" >&2
  exit 2
  ;;
esac
