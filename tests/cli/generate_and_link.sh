#!/usr/bin/env bash
# `attn generate` makes libraries that are ready to link:
#  - for x86-64 (baseline), a program that references every generated function links
#    against the archives and the runtime alone, calls masked_softmax and checks it;
#  - the same for x86-64 with OpenCL: the hand-written GPU schedules, run on PoCL;
#  - for CUDA, each generated library carries sm_80 PTX.
# The GPU targets generate the functions that --functions names (the softmax and the core,
# whose kernels are GPU kernels like the layers'): the release build generates every GPU
# function with the same generator and parameters, tests them on PoCL and assembles every
# CUDA kernel (gpu_kernels.check), so here only `attn generate`'s handling of GPU targets
# is new, and every GPU function would be most of this test's time.
# (arm64 output is run, under qemu, by tools/test.sh's arm64-qemu run.)
# Usage: generate_and_link.sh ATTN CXX HALIDE_INCLUDE_DIR WORK_DIR
set -euo pipefail
attn="$1" cxx="$2" halide_include="$3" work="$4"
rm -rf "$work" && mkdir -p "$work"

link_and_check() {  # target, output folder, then attn generate's other options
  local dir="$work/$2" suffix="manual_$(echo "$1" | tr -c 'A-Za-z0-9\n' _)"
  "$attn" generate --target "$1" --schedule manual --out "$dir" "${@:3}"
{
  echo '#include "HalideBuffer.h"'
  for header in "$dir"/attn_*.h; do echo "#include \"$(basename "$header")\""; done
  echo '#include <cmath>'
  echo '#include <cstdio>'
  echo 'int main() {'
  echo '    const void *functions[] = {'
  for header in "$dir"/attn_*.h; do echo "        reinterpret_cast<const void *>(&$(basename "$header" .h)),"; done
  echo '    };'
  cat <<CPP
    // Softmax over 4 keys of which the last is padding, 3 queries, 2 heads.
    Halide::Runtime::Buffer<float> scores(4, 3, 2, 1), probs(4, 3, 2, 1);
    scores.for_each_element([&](int k, int q, int h, int) { scores(k, q, h, 0) = 0.3f * k - 0.2f * q + h; });
    Halide::Runtime::Buffer<uint8_t> mask(4, 1);
    mask.fill(1);
    mask(3, 0) = 0;
    scores.set_host_dirty();  // for a GPU target: the pipeline copies them to the device
    mask.set_host_dirty();
    if (int error = attn_masked_softmax_${suffix}(scores, mask, false, probs)) return error;
    probs.copy_to_host();
    for (int h = 0; h < 2; ++h) {
        for (int q = 0; q < 3; ++q) {
            const double sum = probs(0, q, h, 0) + probs(1, q, h, 0) + probs(2, q, h, 0);
            const double expected2 = std::exp(0.6) / (1 + std::exp(0.3) + std::exp(0.6));
            if (std::abs(sum - 1) > 1e-6 || probs(3, q, h, 0) != 0 || std::abs(probs(2, q, h, 0) - expected2) > 1e-6) {
                std::printf("wrong softmax at head %d query %d\n", h, q);
                return 1;
            }
        }
    }
    std::printf("linked %zu generated functions; masked_softmax checked\n", sizeof functions / sizeof *functions);
    return 0;
}
CPP
} > "$dir/main.cpp"
"$cxx" -std=c++17 -I "$dir" -I "$halide_include" "$dir/main.cpp" "$dir"/attn_*_"$suffix".a \
  "$dir/attn_halide_runtime.a" -lpthread -ldl -o "$dir/linked"
"$dir/linked"
}
link_and_check x86-64-linux-sse41 x86
gpu_functions='^(masked_softmax|attention_core)$'
link_and_check x86-64-linux-sse41-opencl opencl --functions "$gpu_functions"

"$attn" generate --target x86-64-linux-sse41-cuda-cuda_capability_80 --schedule manual --out "$work/cuda" \
  --functions "$gpu_functions"
shopt -s nullglob
archives=("$work"/cuda/attn_*_manual_*.a)
[[ ${#archives[@]} == 2 ]] || { echo "cuda: expected 2 libraries, found ${#archives[@]}"; exit 1; }
for archive in "${archives[@]}"; do
  grep -aq '.target sm_80' "$archive" || { echo "$archive has no sm_80 PTX"; exit 1; }
done
echo "cuda: ${#archives[@]} libraries, each with sm_80 PTX"
