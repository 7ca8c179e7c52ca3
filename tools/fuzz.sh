#!/usr/bin/env bash
# Fuzzes the command line's file readers with libFuzzer (tests/fuzz/): NumPy .npy,
# safetensors, and a checkpoint's config.json, each built with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer. A crash, a sanitizer report or any
# exception other than attn::Error stops the run with the input that caused it.
#   tools/fuzz.sh [RUNS]     RUNS inputs per target (default 1000000); the test fuzz.smoke runs 5000
# Builds in build/fuzz/, keeps each target's growing corpus there, starts from a few
# valid files written here. Exit 77 (a skip for ctest) when no clang++ is installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-1000000}"
cxx="$(command -v clang++-15 || command -v clang++-14 || command -v clang++ || true)"
[[ -n "$cxx" ]] || { echo "fuzz: no clang++ here (Debian: clang-15); skipped"; exit 77; }
out=build/fuzz
mkdir -p "$out"

# Seeds: a few valid inputs of each kind, so the fuzzer starts past the magic numbers.
python3 - "$out/seeds" <<'EOF'
import json, os, struct, sys
root = sys.argv[1]
def put(kind, name, data):
    os.makedirs(os.path.join(root, kind), exist_ok=True)
    with open(os.path.join(root, kind, name), "wb") as f:
        f.write(data)
def npy(descr, shape, payload, version=1):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pre = 10 if version == 1 else 12
    header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + payload
put("npy", "f32", npy("<f4", "(2, 3)", struct.pack("<6f", *range(6))))
put("npy", "bool", npy("|b1", "(4,)", b"\x01\x00\x01\x01"))
put("npy", "f16", npy("<f2", "(2,)", b"\x00\x3c\x00\xc0"))
put("npy", "i64_v2", npy("<i8", "(3,)", struct.pack("<3q", 1, 0, 1), version=2))
put("npy", "empty", npy("<f4", "(0, 3)", b""))  # found by the fuzzer: memcpy of null pointers
def safetensors(tensors):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data
put("safetensors", "mixed", safetensors({"a": ("F32", [2], struct.pack("<2f", 1, 2)),
                                         "b": ("F16", [2, 1], b"\x00\x3c\x00\x40"),
                                         "c": ("BF16", [1], b"\x80\x3f"), "d": ("I64", [1], b"\0" * 8)}))
put("config", "ok", b'{"num_attention_heads": 2, "layer_norm_eps": 1e-05, "hidden_size": 4}')
put("config", "empty", b"{}")
put("config", "wrong", b'{"num_attention_heads": "two", "hidden_size": 8}')
EOF

# -g1: line tables are all a report needs, and compile a quarter faster than -g.
flags=(-std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iruntime/include -Icli)
# Each source compiled once (the readers are shared by the targets), again only when it or
# a header changed.
object() {
  local source="$1" object="$out/obj/$(basename "${1%.cpp}").o"
  mkdir -p "$out/obj"
  if [[ ! -f "$object" || -n "$(find "$source" cli/*.h -newer "$object")" ]]; then
    "$cxx" "${flags[@]}" -c "$source" -o "$object"
  fi
  echo "$object"
}
for target in npy safetensors config; do
  sources=("tests/fuzz/fuzz_$target.cpp" cli/npy.cpp)
  [[ "$target" != npy ]] && sources+=(cli/safetensors.cpp)
  [[ "$target" == config ]] && sources+=(cli/checkpoint.cpp)
  objects=()
  for source in "${sources[@]}"; do objects+=("$(object "$source")"); done
  binary="$out/fuzz_$target"
  "$cxx" "${flags[@]}" "${objects[@]}" -o "$binary"
  mkdir -p "$out/corpus_$target"
  log="$out/log_$target"
  if ! "$binary" -runs="$runs" -max_len=4096 -print_final_stats=1 -artifact_prefix="$out/$target-" \
      "$out/corpus_$target" "$out/seeds/$target" > "$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $target failed; the input is in $out/$target-*" >&2
    exit 1
  fi
  stat() { awk -v key="stat::$1:" '$1 == key {print $2}' "$log"; }
  echo "fuzz: $target: $(stat number_of_executed_units) inputs, $(stat peak_rss_mb) MB peak, no failure"
done
