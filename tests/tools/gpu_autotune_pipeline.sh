#!/usr/bin/env bash
# The GPU autotuner's whole path (tools/gpu_autotune.py), rehearsed where there is no GPU:
#  - OpenCL on PoCL: a two-candidate bundle of qkv_projection is compiled and packed, each
#    candidate checked against the reference and timed by bench/compare.py, and the winner
#    frozen with its provenance (into a scratch folder, not generated/tuned);
#  - a CPU ISA (the GPU machine's host CPU is tuned this way): a two-candidate bundle
#    measured on this CPU's threads and frozen, with the CPU and its threads recorded;
#  - CUDA: a bundle's candidates are assembled by ptxas (registers recorded), and the measure
#    step refuses to run without a GPU, saying so.
# Usage: gpu_autotune_pipeline.sh PYTHON ATTN_BENCH ATTN_GENERATORS WORK_DIR
# (PYTHON: the project's .venv, which has NumPy and tqdm)
set -euo pipefail
python="$1" bench="$2" generators="$3" work="$4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tool="$root/tools/gpu_autotune.py"
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# Two candidates of qkv_projection for ISA bundled (bundle's further options after the ISA),
# the archive alone unpacked elsewhere (what the GPU machine gets), each candidate checked and
# timed, the winner frozen into a scratch folder.
rehearse() {
  local isa="$1"
  shift
  "$python" "$tool" bundle --isa "$isa" --function qkv_projection --shape-classes short \
    --problems b1_s128_h384_n12 --max-candidates 2 --generator "$generators" --out "$work/$isa/qkv_projection" "$@"
  [[ -f "$work/$isa/qkv_projection.tar.xz" ]] || fail "$isa: no packed bundle"
  compiled=$("$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(sum(c["status"] == "compiled" for c in d["candidates"]))' \
    "$work/$isa/qkv_projection/bundle.json")
  [[ "$compiled" == 2 ]] || fail "$isa: expected 2 compiled candidates, got $compiled"
  mkdir -p "$work/there-$isa" && tar -C "$work/there-$isa" -xJf "$work/$isa/qkv_projection.tar.xz"
  "$python" "$tool" measure --bundle "$work/there-$isa/qkv_projection" --bench "$bench" --out "$work/results-$isa" \
    --rounds 5 --min-time 0.01
  "$python" "$tool" freeze --bundle "$work/$isa/qkv_projection" --results "$work/results-$isa" --tuned-dir "$work/tuned"
}

# (--values: the candidate beside the default splits the reduction in 4, as asked.)
rehearse opencl --values gpu_split_k=4
"$python" - "$work/tuned/opencl" "$work/opencl/qkv_projection/bundle.json" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
default, other = json.loads(pathlib.Path(sys.argv[2]).read_text())["candidates"]
assert default["params"]["gpu_split_k"] == 1 and other["params"]["gpu_split_k"] == 4, (default, other)
tuned = json.loads((folder / "qkv_projection.json").read_text())
provenance = json.loads((folder / "qkv_projection.provenance.json").read_text())
[entry] = tuned["classes"]
assert entry["shape_classes"] == ["short"], entry
assert set(entry["params"]) == {"gpu_thread_rows", "gpu_col_threads", "gpu_row_threads", "gpu_split_k", "gpu_unroll_k"}, entry
p = provenance["classes"][0]["provenance"]
assert p["machine"]["device"] == "opencl" and p["candidates_timed"] == 2, p
timed = [c for c in p["candidates"] if "median_ms" in c]
assert len(timed) == 2 and all(c["median_ms"]["b1_s128_h384_n12"] > 0 for c in timed), timed
assert entry["params"] in [c["params"] for c in timed], "the winner is not a timed candidate"
print(f"frozen: {entry['params']}, {p['winner_time_over_default']} of the default's time")
PY

# A sample of the fused layer's CUDA space (as the campaign bundles it) times every change of
# a single parameter beside the default: the default first, then each single change within
# twice their number, the rest combinations.
"$python" - "$root/tools" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import gpu_autotune
import manifest
m = manifest.load()
space = gpu_autotune.search_space("attention_layer", "cuda", 0, 32)
default = space[0]
names = m.tuning_parameters("attention_layer", gpu=True)
assert default == {n: m.manual_defaults(gpu=True)[n] for n in names}, (default, names)
changed = [sorted(n for n in default if p[n] != default[n]) for p in space[1:]]
singles = {(n[0], p[n[0]]) for p, n in zip(space[1:], changed) if len(n) == 1}
expected = {(n, v) for n in default for v in m.manual_parameters[n].get("gpu_search", []) if v != default[n]}
assert singles == expected, (sorted(expected - singles), sorted(singles - expected))
assert all(len(n) == 1 for n in changed[:2 * len(expected):2]), changed
assert len({tuple(sorted(p.items())) for p in space}) == 32, "a candidate twice"
print(f"sample: the default, {len(singles)} single changes, {31 - len(singles)} combinations")
PY

# --values naming no parameter of the function's schedule is refused, naming it.
if message=$("$python" "$tool" bundle --isa opencl --function qkv_projection --values query_block=16 \
    --generator "$generators" --out "$work/refused" 2>&1); then fail "--values query_block was accepted"; fi
[[ "$message" == *"--values query_block: not a parameter of qkv_projection"* ]] || fail "unexpected refusal: $message"

# A CPU ISA, as the GPU machine's host CPU is tuned (there avx512_skylake; here sse41, which
# every x86-64 CPU runs): the CPU tuner's space, each candidate timed on all threads, and
# the machine's CPU and threads recorded.
rehearse sse41
"$python" - "$work/tuned/sse41" <<'PY'
import json, os, pathlib, sys
folder = pathlib.Path(sys.argv[1])
[entry] = json.loads((folder / "qkv_projection.json").read_text())["classes"]
assert set(entry["params"]) == {"tile_rows", "tile_vectors"}, entry
p = json.loads((folder / "qkv_projection.provenance.json").read_text())["classes"][0]["provenance"]
machine = p["machine"]
assert machine["device"] == "cpu" and machine["threads"] == os.cpu_count() and machine["cpu"], machine
assert p["candidates_timed"] == 2 and entry["params"] in [c["params"] for c in p["candidates"]], p
print(f"frozen for the CPU: {entry['params']}, {p['winner_time_over_default']} of the default's time")
PY

# CUDA: compiled and assembled here; timed only where a GPU is.
if ! command -v ptxas >/dev/null && [[ ! -x /usr/local/cuda/bin/ptxas ]]; then
  echo "gpu autotune pipeline: ok on OpenCL; the CUDA part skipped: no ptxas (the CUDA toolkit) here"
  exit 0
fi
"$python" "$tool" bundle --isa cuda --function masked_softmax --shape-classes short --problems b1_s128_h384_n12 \
  --generator "$generators" --out "$work/cuda/masked_softmax"
"$python" -c 'import json, sys; [c] = json.load(open(sys.argv[1]))["candidates"]; assert c["status"] == "compiled" and c["registers"] > 0, c' \
  "$work/cuda/masked_softmax/bundle.json" || fail "the CUDA candidate was not assembled"
if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
  echo "a GPU is here: the CUDA measure step is the campaign's (tools/gpu_machine.sh tune)"
else
  out=$("$python" "$tool" measure --bundle "$work/cuda/masked_softmax" --bench "$bench" --out "$work/cuda-results" 2>&1) &&
    fail "measure ran without a GPU"
  echo "$out" | grep -q "no NVIDIA GPU" || fail "measure without a GPU did not say why: $out"
fi
echo "gpu autotune pipeline: ok"
