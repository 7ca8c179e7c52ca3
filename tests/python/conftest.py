"""Shared by the Python package's tests: the accuracy rule of DESIGN.md and the references.

The rule: a result's error against the float64 reference may be at most twice that of the
plain float32 implementation of the same formula on the same input, plus 1e-5.
"""
import math

import numpy as np
import pytest

import torch  # noqa: E402  (tools/python-requirements.txt; tests/python/run.sh skips without it)
import attn  # noqa: E402

FLOOR = 1e-5


def assert_accurate(actual, exact, plain, what=""):
    actual, exact, plain = (np.asarray(torch.as_tensor(a).double()) for a in (actual, exact, plain))
    assert actual.shape == exact.shape, f"{what}: shape {actual.shape}, expected {exact.shape}"
    error = np.abs(actual - exact)
    tolerance = 2 * float(np.abs(plain - exact).max(initial=0)) + FLOOR
    worst = np.unravel_index(int(np.argmax(error)), error.shape) if error.size else ()
    print(f"{what}: max error {error.max(initial=0):.3g} (at {worst}), mean {error.mean() if error.size else 0:.3g},"
          f" tolerance {tolerance:.3g}")
    assert float(error.max(initial=0)) <= tolerance, f"{what}: max error {error.max():.3g} > {tolerance:.3g} at {worst}"


def reference_attention(q, k, v, keys=None, bias=None, causal=False, scale=None):
    """The core in q's dtype: [B, heads, S, d] tensors; keys [B, S_k] (True = real); bias
    additive, broadcastable; causal bottom-right. An all-excluded row gives zeros."""
    s_q, s_k, d = q.shape[2], k.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if bias is not None:
        scores = scores + bias.to(q.dtype)
    allowed = torch.ones(q.shape[0], 1, s_q, s_k, dtype=torch.bool)
    if keys is not None:
        allowed = allowed & keys.bool()[:, None, None, :]
    if causal:
        i = torch.arange(s_q)[:, None]
        j = torch.arange(s_k)[None, :]
        allowed = allowed & (j <= i + (s_k - s_q))
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs @ v


def reference_layer(x, w, heads, eps, keys=None, bias=None, causal=False):
    """LayerNorm(x + attention(x) W_o^T + b_o) in x's dtype; w: the weights by attn's names."""
    b, s, hidden = x.shape
    d = hidden // heads
    t = {n: a.to(x.dtype) for n, a in w.items()}

    def split(y):
        return y.view(b, s, heads, d).transpose(1, 2)
    q, k, v = (split(x @ t[f"w_{n}"].T + t[f"b_{n}"]) for n in "qkv")
    ctx = reference_attention(q, k, v, keys, bias, causal).transpose(1, 2).reshape(b, s, hidden)
    z = x + ctx @ t["w_o"].T + t["b_o"]
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return t["gamma"] * (z - mean) / torch.sqrt(var + eps) + t["beta"]


def random_weights(hidden, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for n in "qkvo":
        w[f"w_{n}"] = torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)
        w[f"b_{n}"] = torch.randn(hidden, generator=g) * 0.1
    w["gamma"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    w["beta"] = 0.1 * torch.randn(hidden, generator=g)
    return w


def cpu_variants(function):
    """The variants this machine runs that provide `function`, by name."""
    return [v["name"] for v in attn.variants() if v["runnable"] and v["device"] == "cpu" and function in v["functions"]]
