#!/usr/bin/env python3
"""tools/gpu_kernels.py's check really fails: a hand-written PTX kernel that spills under a
register cap, a launch whose dynamic shared memory is bounded over the limit, a fused
layer's kernel transposing a weight, and a block needing more registers than an SM has are
named with their figures. Skips (77) without ptxas.
Usage: test_gpu_kernels.py WORK_DIR"""
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "tools"))
import gpu_kernels  # noqa: E402


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")


ptxas = gpu_kernels.find_ptxas(None)
if not ptxas:
    print("SKIP: ptxas not found")
    sys.exit(gpu_kernels.SKIP)
work = pathlib.Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)

# 40 values loaded (volatile: ptxas may not load them again) and all live until the last
# is loaded: about 45 registers, so a cap of 24 (sm_90's least) must spill.
values = 40
ptx = [".version 7.0", ".target sm_80", ".address_size 64",
       ".visible .entry many_live(.param .u64 in, .param .u64 out)", "{",
       f".reg .f32 %f<{values + 1}>;", ".reg .b64 %rd<3>;",
       "ld.param.u64 %rd1, [in];", "ld.param.u64 %rd2, [out];"]
ptx += [f"ld.volatile.global.f32 %f{i}, [%rd1+{4 * i}];" for i in range(values)]
ptx += [f"mov.f32 %f{values}, 0f00000000;"]
ptx += [f"fma.rn.f32 %f{values}, %f{i}, %f{values}, %f{i};" for i in reversed(range(values))]
ptx += [f"st.global.f32 [%rd2], %f{values};", "ret;", "}"]
path = work / "many_live.ptx"
path.write_text("\n".join(ptx) + "\n")

tool = [sys.executable, str(root / "tools/gpu_kernels.py"), "--ptx", str(path), "--check"]
free = subprocess.run(tool, capture_output=True, text=True)
check(free.returncode == 0, f"uncapped, the kernel passes:\n{free.stdout}{free.stderr}")
capped = subprocess.run(tool + ["--max-registers", "24"], capture_output=True, text=True)
check(capped.returncode == 1, f"capped at 24 registers, the check fails (exit {capped.returncode}):\n"
                              f"{capped.stdout}{capped.stderr}")
check("FAIL: many_live.ptx - many_live: spills " in capped.stdout and "bytes stored" in capped.stdout,
      f"the failure names the kernel and its spills:\n{capped.stdout}")

# A launch as Halide's lowered host code writes it, its shared bytes bounded through a let
# and a per-block maximum: 64 rows of 1 KiB, and 256 bytes: 65792, over 49152.
stmt = """
 let t1 = min(x.extent.1, 64)
 allocate tile.shared_size[int32 * 1] in Stack
 tile.shared_size[0] = 0
  tile.shared_size[0] = max(tile.shared_size[0], min(t9 - (b*32), 32)*2)
 let tile.shared_size_var = tile.shared_size[0]
 let r = halide_cuda_run(cuda[0], "_kernel_big", t7, 1, 1, 32, 8, 1, 0 + ((t1*256) + tile.shared_size_var)*4, \
(void *)make_struct((int64)8))
"""
launched = gpu_kernels.launches(stmt)
check(launched == {"_kernel_big": {"threads": (256, 256), "dynamic_shared": (0, 65792)}}, f"the bounds: {launched}")
figures = {"_kernel_big": {"registers": 32, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0,
                           "static_shared": 0}}
rows = gpu_kernels.kernel_rows("manual_cuda", "attention_scores", figures, launched)
failures = gpu_kernels.check(rows, 49152)
check(len(failures) == 1 and failures[0].startswith("manual_cuda attention_scores _kernel_big: 0 bytes static + "
                                                    "≤ 65792 dynamic shared memory per block, over the 49152"),
      f"the failure names the kernel and its shared memory: {failures}")
check(rows[0]["occupancy"]["blocks"] == 3 and rows[0]["occupancy"]["limited_by"] == ["shared"],
      f"228 KiB / (65792 + 1024) bytes: 3 blocks, limited by shared memory: {rows[0]['occupancy']}")

# A fused layer's kernel that transposes a weight fails; a stage's may (it gets nn.Linear's).
plain = {"registers": 10, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0, "static_shared": 0}
transposes = {"_kernel_q_weight_t_s0_hidden_to_block_id_y": plain, "_kernel_w_o_t_s0_hidden_to_block_id_y": plain}
layer = gpu_kernels.kernel_rows("manual_cuda", "attention_layer", transposes, None)
stage = gpu_kernels.kernel_rows("manual_cuda", "qkv_projection", transposes, None)
failures = gpu_kernels.check(layer + stage, 49152, ["attention_layer"])
check(len(failures) == 2 and all(f.startswith("manual_cuda attention_layer _kernel_") and
                                 f.endswith("transposes a weight on every call, which the runtime prepared once")
                                 for f in failures), f"the fused layer's two transposes fail, named: {failures}")
# A block of 1024 threads at 128 registers each needs 131072, twice an SM's: it cannot launch
# (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), whatever the variant's source; at 64 it fits.
def block(registers):
    launch = {"_kernel_wide": {"threads": (1024, 1024), "dynamic_shared": (0, 0)}}
    return gpu_kernels.kernel_rows("mullapudi2016_cuda", "weighted_sum", {"_kernel_wide": {**plain,
                                   "registers": registers}}, launch)
failures = gpu_kernels.check(block(128), 49152, checked_variants={"manual_cuda"})
check(failures == ["mullapudi2016_cuda weighted_sum _kernel_wide: cannot launch: its block of 1024 threads at 128 "
                   "registers each needs more than an SM's 65536"], f"the unlaunchable kernel fails, named: {failures}")
check(gpu_kernels.check(block(64), 49152, checked_variants={"manual_cuda"}) == [], "at 64 registers it launches")
print("gpu_kernels: a spilling kernel, a block over the shared memory limit, a fused layer's per-call "
      "weight transpose and a block that cannot launch all fail, named")
