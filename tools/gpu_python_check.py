#!/usr/bin/env python3
"""The Python package on CUDA tensors, for the GPU machine (tools/gpu_machine.sh python):
no pytest or transformers there, so a plain script. Checks attn.scaled_dot_product_attention
and attn.AttentionLayer on CUDA tensors against torch's own float64 computation (the
accuracy rule of DESIGN.md: at most twice torch's float32 error, plus 1e-5), then times
them beside torch's SDPA and eager layer, interleaved (median of per-round ratios).
Exit 1 on any failed check.

    PYTHONPATH=<carried package> python3 tools/gpu_python_check.py [--rounds 7]
"""
import argparse
import math
import statistics
import sys
import time

import torch

import attn


def rule(name, actual, exact, plain):
    error = (actual.double() - exact).abs().max().item()
    tolerance = 2 * (plain.double() - exact).abs().max().item() + 1e-5
    ok = error <= tolerance
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max error {error:.3g}, tolerance {tolerance:.3g}")
    return ok


def sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def layer_reference(x, w, heads, eps, keys):
    b, s, h = x.shape
    t = {n: a.to(x.dtype) for n, a in w.items()}

    def split(y):
        return y.view(b, s, heads, h // heads).transpose(1, 2)
    q, k, v = (split(x @ t[f"w_{n}"].T + t[f"b_{n}"]) for n in "qkv")
    ctx = sdpa(q, k, v, keys[:, None, None, :]).transpose(1, 2).reshape(b, s, h)
    return torch.nn.functional.layer_norm(x + ctx @ t["w_o"].T + t["b_o"], (h,), t["gamma"], t["beta"], eps)


def timed(functions, rounds, min_time=0.2):
    """{name: [ms per call, one per round]}, the functions run in a rotating order."""
    names, times = list(functions), {n: [] for n in functions}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs, start = 0, time.perf_counter()
            while time.perf_counter() - start < min_time:
                functions[name]()
                torch.cuda.synchronize()
                runs += 1
            times[name].append((time.perf_counter() - start) * 1e3 / runs)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_python_check: torch sees no CUDA device")
        return 1
    cuda = [v["name"] for v in attn.variants() if v["device"] == "cuda" and v["runnable"]]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; attn's CUDA variants here: {cuda}")
    if not cuda:
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    with torch.inference_mode():
        for b, heads, s, d in ((2, 12, 128, 64), (1, 12, 1000, 64)):
            q, k, v = (torch.randn(b, heads, s, d, device="cuda", generator=g) for _ in range(3))
            keys = torch.ones(b, s, dtype=torch.bool, device="cuda")
            keys[-1, s // 2:] = False
            mask = keys[:, None, None, :]
            ok &= rule(f"scaled_dot_product_attention [{b}, {heads}, {s}, {d}], CUDA tensors",
                       attn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                       sdpa(q.double(), k.double(), v.double(), mask), sdpa(q, k, v, mask))
        hidden, heads, eps = 768, 12, 1e-12
        w = {f"w_{n}": torch.randn(hidden, hidden, device="cuda", generator=g) / math.sqrt(hidden) for n in "qkvo"}
        w |= {f"b_{n}": 0.1 * torch.randn(hidden, device="cuda", generator=g) for n in "qkvo"}
        w |= {"gamma": torch.ones(hidden, device="cuda"), "beta": torch.zeros(hidden, device="cuda")}
        layer = attn.AttentionLayer(*(w[n] for n in attn._WEIGHTS), num_heads=heads, layer_norm_eps=eps)
        x = torch.randn(8, 128, hidden, device="cuda", generator=g)
        keys = torch.ones(8, 128, dtype=torch.bool, device="cuda")
        keys[1::2, 64:] = False
        ok &= rule(f"AttentionLayer ({layer.variant}) [8, 128, 768], padded, CUDA tensors", layer(x, keys),
                   layer_reference(x.double(), w, heads, eps, keys), layer_reference(x, w, heads, eps, keys))
        q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", generator=g) for _ in range(3))
        times = timed({"attn core": lambda: attn.scaled_dot_product_attention(q, k, v),
                       "torch sdpa": lambda: sdpa(q, k, v, None),
                       "attn layer": lambda: layer(x, keys),
                       "torch layer": lambda: layer_reference(x, w, heads, eps, keys)}, args.rounds)
    for ours, theirs in (("attn core", "torch sdpa"), ("attn layer", "torch layer")):
        ratios = [a / b for a, b in zip(times[theirs], times[ours])]
        print(f"{ours} {statistics.median(times[ours]):.3f} ms, {theirs} {statistics.median(times[theirs]):.3f} ms: "
              f"{theirs} time / ours, median over {args.rounds} rounds {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}, {max(ratios):.2f}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
