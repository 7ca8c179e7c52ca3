#!/usr/bin/env python3
"""tools/gpu_trace.py on made-up traces whose figures are known: five calls of four kernels,
one name launched twice a call (the first call, slower, left out); a stray launch before the
first call, a kernel without timestamps and a truncated last line left out and counted;
per call an allocation, a pageable copy and four launches on the host, plus the benchmark's
setup burst between two calls, which the per-window medians ignore; Google Benchmark's time.
A trace of one call and a case that failed are refused with their reasons.
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


correlation = iter(range(1, 10**6))


def kernel(name, start, end, corr=0):
    return {"kind": "kernel", "name": name, "start": start, "end": end, "grid": [4, 12, 8], "block": [32, 1, 1],
            "registers": 255, "static_shared": 0, "dynamic_shared": 36864, "stream": 7, "correlation": corr}


def driver(name, start, end, corr=0):
    return {"kind": "driver", "name": name, "start": start, "end": end, "thread": 1, "correlation": corr}


def copy(start, end, corr, size=36):
    return {"kind": "memcpy", "copy_kind": 1, "src_kind": 1, "dst_kind": 3, "async": False, "bytes": size,
            "start": start, "end": end, "stream": 7, "correlation": corr}


# Call c's kernels from T = c ms + 0.5 ms: a (10 µs), b (20 µs; 30 µs in call 0), a again
# (10 µs), c (5 µs), 2 µs apart; before them on the host a 50 µs cuMemAlloc_v2, a copy of
# 36 bytes (3 µs on the GPU) and a launch per kernel (5 µs each).
records = [driver("cuModuleLoadData", 0, 100_000), kernel("stray", 150_000, 151_000), kernel("a", 0, 0)]
for call in range(5):
    t = call * 1_000_000 + 500_000
    records.append(driver("cuMemAlloc_v2", t - 300_000, t - 250_000))
    corr = next(correlation)
    records += [driver("cuMemcpyHtoD_v2", t - 210_000, t - 205_000, corr), copy(t - 200_000, t - 197_000, corr)]
    at = t
    for i, (name, length) in enumerate([("a", 10_000), ("b", 30_000 if call == 0 else 20_000), ("a", 10_000),
                                        ("c", 5_000)]):
        corr = next(correlation)
        records += [driver("cuLaunchKernel", t - 100_000 + 10_000 * i, t - 95_000 + 10_000 * i, corr),
                    kernel(name, at, at + length, corr)]
        at += length + 2_000
    if call == 2:  # the benchmark's setup between two runs: ten 1 MB uploads
        for u in range(10):
            corr = next(correlation)
            records += [driver("cuMemcpyHtoD_v2", t + 100_000 + u * 1000, t + 100_500 + u * 1000, corr),
                        copy(t + 100_000 + u * 1000, t + 100_400 + u * 1000, corr, 1 << 20)]
records.append({"kind": "dropped", "records": 0})
case = "attention_layer__manual_cuda__b8_s128_h768_n12_varlen"
(work / f"{case}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + '\n{"kind": "kern')
(work / f"{case}.bench.json").write_text(json.dumps(
    {"benchmarks": [{"name": "x", "run_type": "iteration", "real_time": 0.5, "time_unit": "ms"}]}))
# One call only, and a case that could not run there.
(work / "one.jsonl").write_text(json.dumps(kernel("a", 10, 20)) + "\n")
(work / "failed.bench.json").write_text(json.dumps({"benchmarks": [
    {"name": "x", "run_type": "iteration", "error_occurred": True, "error_message": "cannot run here: no GPU"}]}))

run = subprocess.run([sys.executable, str(root / "tools/gpu_trace.py"), str(work)], capture_output=True, text=True)
check(run.returncode == 1, f"gpu_trace.py exits 1 when a case is refused: {run.stdout}{run.stderr}")
results = {r["case"]: r for r in json.loads((work / "trace.json").read_text())}
r = results["attention_layer/manual_cuda/b8_s128_h768_n12_varlen"]
check("error" not in r, f"summarized: {r.get('error')}")
check(r["calls"] == 4, f"4 calls after the first, got {r['calls']}")
check(r["kernels_per_call"] == 4, f"4 kernels a call (a launched twice), got {r['kernels_per_call']}")
check([k["kernel"] for k in r["kernels"]] == ["a", "b", "a", "c"], f"launch order, got {r['kernels']}")
check(abs(r["busy_us"] - 45) < 1e-9, f"busy 10 + 20 + 10 + 5 = 45 µs, got {r['busy_us']}")
check(abs(r["span_us"] - 51) < 1e-9, f"span 45 + 3 gaps of 2 = 51 µs, got {r['span_us']}")
check(r["wall_us"] == 500, f"wall 0.5 ms, got {r['wall_us']}")
check(r["kernels"][1]["median_us"] == 20, "b's first-call 30 µs left out")
check(r["kernels_without_timestamps"] == 1 and r["unreadable_lines"] == 1,
      f"the kernel without timestamps and the truncated line counted, got {r}")
check(r["host_windows"] == 3, f"3 windows between 4 calls' first launches, got {r['host_windows']}")
driver_calls = {d["call"]: d for d in r["driver"]}
check("cuModuleLoadData" not in driver_calls, "the first call's JIT left out")
check(driver_calls["cuLaunchKernel"]["per_layer_call"] == 4, f"4 launches a call: {driver_calls['cuLaunchKernel']}")
check(driver_calls["cuMemAlloc_v2"]["per_layer_call"] == 1 and driver_calls["cuMemAlloc_v2"]["per_call_us"] == 50,
      f"one 50 µs allocation a call: {driver_calls['cuMemAlloc_v2']}")
check(driver_calls["cuMemcpyHtoD_v2"]["per_layer_call"] == 1, f"the setup burst ignored: {driver_calls['cuMemcpyHtoD_v2']}")
(c,) = r["copies"]
check(c["kind"] == "host to device (pageable to device)" and c["per_call"] == 1 and c["bytes_per_call"] == 36
      and c["per_call_us"] == 3, f"one 36-byte pageable copy a call, got {c}")
md = (work / "trace.md").read_text()
check("| attention_layer/manual_cuda/b8_s128_h768_n12_varlen | 4 | 4 | 500.0 | 51.0 | 45.0 | 449.0 | 6.0 |" in md,
      f"the summary row:\n{md}")
check("no repeating sequence" in results["one"]["error"], f"one call refused: {results['one']}")
check(results["failed"]["error"] == "the case failed: cannot run here: no GPU", f"failed case: {results['failed']}")
print("ok: gpu_trace.py's per-call figures (repeated names, stray and untimed kernels, setup bursts), refusals")
