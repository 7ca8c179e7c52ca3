#!/usr/bin/env python3
"""tools/gpu_trace.py on a made-up trace whose figures are known: three calls of three
kernels (the first call, with its JIT's driver calls, left out), a host allocation and a
copy per call, Google Benchmark's time; and a trace of one call refused with its reason.
Usage: test_gpu_trace.py WORK_DIR"""
import json
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[2]
work = pathlib.Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
for old in work.glob("*"):
    old.unlink()


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")


def kernel(name, start, end):
    return {"kind": "kernel", "name": name, "start": start, "end": end, "grid": [4, 12, 8], "block": [32, 1, 1],
            "registers": 255, "static_shared": 0, "dynamic_shared": 36864, "stream": 7}


# Calls at 0, 1e6 and 2e6 ns: kernels a (10 µs), b (20 µs; 30 µs in the first call), c (5 µs),
# 2 µs apart; a 100 µs cuModuleLoadData before the first call only; per call a 50 µs
# cuMemAlloc_v2 on the host and a 36-byte copy to the device taking 3 µs.
records = [{"kind": "driver", "name": "cuModuleLoadData", "start": 0, "end": 100_000, "thread": 1}]
for call in range(3):
    t = call * 1_000_000 + 200_000
    b = 30_000 if call == 0 else 20_000
    records += [kernel("a", t, t + 10_000), kernel("b", t + 12_000, t + 12_000 + b),
                kernel("c", t + 14_000 + b, t + 19_000 + b)]
    records += [{"kind": "driver", "name": "cuMemAlloc_v2", "start": t - 60_000, "end": t - 10_000, "thread": 1},
                {"kind": "memcpy", "copy_kind": 1, "bytes": 36, "start": t - 5_000, "end": t - 2_000}]
records.append({"kind": "dropped", "records": 0})
(work / "attention_layer__manual_cuda__b8_s128_h768_n12_varlen.jsonl").write_text(
    "\n".join(json.dumps(r) for r in records) + "\n")
(work / "attention_layer__manual_cuda__b8_s128_h768_n12_varlen.bench.json").write_text(json.dumps(
    {"benchmarks": [{"name": "x", "run_type": "iteration", "real_time": 0.5, "time_unit": "ms"}]}))

run = subprocess.run([sys.executable, str(root / "tools/gpu_trace.py"), str(work)], capture_output=True, text=True)
check(run.returncode == 0, f"gpu_trace.py failed: {run.stdout}{run.stderr}")
(result,) = json.loads((work / "trace.json").read_text())
check(result["case"] == "attention_layer/manual_cuda/b8_s128_h768_n12_varlen", f"case {result['case']}")
check(result["calls"] == 2, f"2 calls after the first, got {result['calls']}")
check(result["kernels_per_call"] == 3, f"3 kernels a call, got {result['kernels_per_call']}")
check(abs(result["busy_us"] - 35) < 1e-9, f"busy 10 + 20 + 5 = 35 µs, got {result['busy_us']}")
check(abs(result["span_us"] - 39) < 1e-9, f"span 34 + 5 = 39 µs, got {result['span_us']}")
check(abs(result["wall_us"] - 500) < 1e-9, f"wall 0.5 ms = 500 µs, got {result['wall_us']}")
kernels = {k["kernel"]: k for k in result["kernels"]}
check([k["kernel"] for k in result["kernels"]] == ["a", "b", "c"], "kernels in launch order")
check(kernels["b"]["median_us"] == 20, f"b's first-call 30 µs left out, got {kernels['b']['median_us']}")
check(abs(kernels["b"]["share"] - 20 / 35) < 1e-9, f"b's share 20/35, got {kernels['b']['share']}")
check(kernels["a"]["shared_bytes"] == 36864 and kernels["a"]["grid"] == [4, 12, 8], "launch shape kept")
driver = {d["call"]: d for d in result["driver"]}
check("cuModuleLoadData" not in driver, "the first call's JIT left out")
# The first call's allocation ends before its kernels, so only the two later ones count.
check(driver["cuMemAlloc_v2"]["per_layer_call"] == 1 and driver["cuMemAlloc_v2"]["per_call_us"] == 50,
      f"one 50 µs cuMemAlloc_v2 per call, got {driver['cuMemAlloc_v2']}")
(copy,) = result["copies"]
check(copy["kind"] == "host to device" and copy["bytes_per_call"] == 36 and copy["per_call_us"] == 3,
      f"one 36-byte copy to the device per call, got {copy}")
md = (work / "trace.md").read_text()
check("| attention_layer/manual_cuda/b8_s128_h768_n12_varlen | 2 | 3 | 500.0 | 39.0 | 35.0 | 461.0 | 4.0 |" in md,
      f"the summary row:\n{md}")

# One call only: nothing left once the first is left out, said so, exit 1.
(work / "one.jsonl").write_text(json.dumps(kernel("a", 0, 10)) + "\n")
run = subprocess.run([sys.executable, str(root / "tools/gpu_trace.py"), str(work)], capture_output=True, text=True)
check(run.returncode == 1 and "at least 2 are needed" in run.stdout, f"one call refused: {run.stdout}{run.stderr}")
print("ok: gpu_trace.py's per-call figures, warm-up left out, one-call trace refused")
