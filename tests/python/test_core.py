"""attn.scaled_dot_product_attention: every CPU variant against the float64 reference, torch's
argument conventions, masks, layouts, errors, threads and the torch custom operator."""
import math
import threading

import numpy as np
import pytest
import torch

import attn
from conftest import assert_accurate, cpu_variants, reference_attention


def qkv(batch=2, heads=3, s_q=13, s_k=17, d=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, s, d, generator=g) for s in (s_q, s_k, s_k))


def check(actual, q, k, v, what, **masks):
    exact = reference_attention(q.double(), k.double(), v.double(), **masks)
    plain = reference_attention(q, k, v, **masks)
    assert_accurate(actual, exact, plain, what)


@pytest.mark.parametrize("variant", cpu_variants("attention_core"))
def test_every_variant_matches_the_reference(variant):
    q, k, v = qkv()
    keys = torch.ones(2, 17, dtype=torch.bool)
    keys[1, 9:] = False
    out = attn.scaled_dot_product_attention(q, k, v, key_padding_mask=keys, is_causal=True, variant=variant)
    check(out, q, k, v, variant, keys=keys, causal=True)


def test_numpy_in_numpy_out():
    q, k, v = qkv()
    out = attn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 3, 13, 16)
    check(out, q, k, v, "numpy")


def test_matches_torch_sdpa_for_square_causal_and_scale():
    q, k, v = qkv(s_q=17)
    for kwargs in ({}, {"is_causal": True}, {"scale": 0.3}):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        actual = attn.scaled_dot_product_attention(q, k, v, **kwargs)
        check(actual, q, k, v, str(kwargs), causal=kwargs.get("is_causal", False), scale=kwargs.get("scale"))
        assert torch.allclose(actual, expected, atol=1e-5)


def test_masks_boolean_additive_and_keys_only():
    q, k, v = qkv()
    g = torch.Generator().manual_seed(7)
    general = torch.rand(2, 1, 13, 17, generator=g) > 0.3
    general[..., 0] = True  # no row fully masked (test_masks_that_broadcast_... covers those)
    additive = torch.randn(2, 3, 13, 17, generator=g)
    keys_only = torch.rand(2, 1, 1, 17, generator=g) > 0.5
    keys_only[..., 0] = True
    for name, mask, bias, keys in (
            ("boolean", general, torch.zeros(2, 1, 13, 17).masked_fill(~general, float("-inf")), None),
            ("additive", additive, additive, None),
            ("additive broadcast", additive[:1, :1], additive[:1, :1], None),
            ("keys only, boolean", keys_only, None, keys_only[:, 0, 0]),
            ("keys only, additive", torch.zeros(2, 1, 1, 17).masked_fill(~keys_only, float("-inf")), None,
             keys_only[:, 0, 0])):
        actual = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        check(actual, q, k, v, name, bias=bias, keys=keys)


def test_masks_that_broadcast_and_rows_they_empty_match_torch():
    q, k, v = qkv(s_q=17)
    rows = torch.ones(2, 1, 17, 17, dtype=torch.bool)
    rows[0, 0, 3] = False  # query 3 of batch 0 sees no key: zeros, as torch gives
    for mask in (torch.ones(2, 1, 1, 1, dtype=torch.bool), torch.zeros(1, 1), torch.zeros(17, 1), rows,
                 torch.zeros(2, 1, 17, 17).masked_fill(~rows, float("-inf"))):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        actual = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.allclose(actual, expected.nan_to_num(0.0), atol=1e-5), list(mask.shape)
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=rows)
    assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))


def test_a_row_without_keys_gets_zeros():
    q, k, v = qkv()
    keys = torch.ones(2, 17, dtype=torch.bool)
    keys[0] = False
    out = attn.scaled_dot_product_attention(q, k, v, key_padding_mask=keys.to(torch.int64))
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isfinite(out).all()


def test_layouts_transposed_views_and_strided_copies():
    q, k, v = qkv(s_q=17)
    expected = attn.scaled_dot_product_attention(q, k, v)
    # [B, S, heads, d] memory viewed as [B, heads, S, d], as transformers makes it: used in place.
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert torch.equal(attn.scaled_dot_product_attention(*views), expected)
    # Any other layout is copied first.
    wide = [torch.stack([t, t], dim=-1)[..., 0] for t in (q, k, v)]
    assert not wide[0].is_contiguous()
    assert torch.equal(attn.scaled_dot_product_attention(*wide), expected)
    # The output is a view of [B, S_q, heads, d] memory.
    assert expected.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("call, error, message", [
    (lambda q, k, v: attn.scaled_dot_product_attention(q.double(), k, v), TypeError,
     "q: expected dtype float32, got float64"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k[:, :, :5], v), ValueError,
     "v: expected shape [2, 3, 5, 16]"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k[:, :2], v), ValueError, "k: expected shape [2, 3, S_k, 16]"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q[0], k, v), ValueError, "q: expected 4 dimensions"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k.numpy(), v), TypeError, "k: expected a torch.Tensor"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q.tolist(), k, v), TypeError,
     "q: expected a NumPy array or torch tensor, got builtins.list"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(3, 17)), ValueError,
     "attn_mask: expected a shape broadcastable to [2, 3, 13, 17]"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(13, 17, dtype=torch.int32)),
     TypeError, "attn_mask: expected dtype float32, got int32"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, key_padding_mask=torch.ones(2, 17)), TypeError,
     "key_padding_mask: expected a bool or integer mask"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, key_padding_mask=torch.ones(2, 16, dtype=torch.bool)),
     ValueError, "key_padding_mask: expected shape [2, 17] [B, S_k], got [2, 16]"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q, k, v, variant="no_such_variant"), attn.Error,
     "variant: expected one of"),
    (lambda q, k, v: attn.scaled_dot_product_attention(q.requires_grad_(), k, v), RuntimeError,
     "q: attn computes inference only"),
])
def test_bad_input_names_the_argument(call, error, message):
    q, k, v = qkv()
    with pytest.raises(error) as caught:
        call(q, k, v)
    assert message in str(caught.value)


def reference_bf16_core(q, k, v):
    """The bf16 core's rounding (DESIGN.md, "Reduced precision") in double: q, k and v rounded to
    bf16, each weight exp(s - offset), offset the row max rounded up to a multiple of ln 2,
    rounded to bf16 before it is summed and weights v."""
    def bf16(t):
        return t.float().to(torch.bfloat16).double()
    q, k, v = bf16(q), bf16(k), bf16(v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    offset = torch.ceil(scores.amax(-1, keepdim=True) / math.log(2)) * math.log(2)
    weights = bf16(torch.exp(scores - offset))
    return (weights @ v) / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("variant", cpu_variants("attention_core_bf16"))
def test_bf16_core_computes_its_rounding(variant):
    q, k, v = qkv()
    out = attn.scaled_dot_product_attention(q, k, v, variant=variant, precision="bf16", allow_storage_only=True)
    assert out.dtype == torch.float32
    rounded, exact = reference_bf16_core(q, k, v), reference_attention(q.double(), k.double(), v.double())
    # A weight whose f32 exponential and the reference's double one lie either side of a bf16
    # midpoint rounds to the other neighbour: c moves by at most 2^-7 of that weight's share of
    # |v - c| (the C++ tests bound it per element: reference::core_allowance); all of them
    # together, by at most 2^-7 · 2 max|v|.
    assert float((out.double() - rounded).abs().max()) <= 2 ** -7 * 2 * float(v.abs().max()) + 1e-5
    # And it is the bf16 computation: nearer the reference of its rounding than the fp32 one.
    assert float((out.double() - rounded).abs().mean()) < float((out.double() - exact).abs().mean())


def test_bfloat16_tensors_in_either_precision():
    q, k, v = (t.bfloat16() for t in qkv())
    for precision in ("fp32",) + (("bf16",) if cpu_variants("attention_core_bf16") else ()):
        out = attn.scaled_dot_product_attention(q, k, v, is_causal=True, precision=precision, allow_storage_only=True)
        assert out.dtype == torch.bfloat16 and out.shape == q.shape
        # The same as on the widened inputs (exact), rounded back to bfloat16.
        widened = attn.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                    precision=precision, allow_storage_only=True)
        assert torch.equal(out, widened.bfloat16()), precision


def test_bf16_core_refusals_name_the_argument():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="precision: expected one of 'fp32', 'bf16'"):
        attn.scaled_dot_product_attention(q, k, v, precision="int8")
    without = [name for name in cpu_variants("attention_core") if name not in cpu_variants("attention_core_bf16")]
    if without:
        with pytest.raises(attn.Error, match="does not provide attention_core_bf16") as caught:
            attn.scaled_dot_product_attention(q, k, v, variant=without[0], precision="bf16")
        assert caught.value.argument == "variant"


def test_runtime_errors_carry_the_argument():
    q, k, v = qkv()
    with pytest.raises(attn.Error) as caught:
        attn.scaled_dot_product_attention(q, k, v, variant="no_such_variant")
    assert caught.value.argument == "variant" and isinstance(caught.value, ValueError)


def test_calls_from_several_threads_agree_with_one():
    q, k, v = qkv(batch=4, s_q=64, s_k=64, d=32)
    expected = attn.scaled_dot_product_attention(q, k, v)
    results = [None] * 6

    def work(n):
        results[n] = attn.scaled_dot_product_attention(q, k, v)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reproducible = attn.select()["bitwise_reproducible"]
    for r in results:
        assert torch.equal(r, expected) if reproducible else torch.allclose(r, expected, atol=1e-6)


def test_thread_count_is_set_and_results_stay():
    q, k, v = qkv()
    expected = attn.scaled_dot_product_attention(q, k, v)
    previous = attn.set_num_threads(1)
    try:
        assert attn.num_threads() == 1
        assert torch.allclose(attn.scaled_dot_product_attention(q, k, v), expected, atol=1e-6)
        with pytest.raises(attn.Error, match=f"threads: expected 0 .* to {attn.MAX_THREADS}, got -1"):
            attn.set_num_threads(-1)
    finally:
        attn.set_num_threads(previous)


def test_custom_operator_passes_torch_opcheck():
    q, k, v = qkv()
    torch.library.opcheck(torch.ops.attn.scaled_dot_product_attention.default,
                          (q, k, v, None, None, True, None, "", "fp32", False), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    q, k, v = qkv(s_q=17)

    def model(q, k, v):
        return attn.scaled_dot_product_attention(q * 2, k, v, is_causal=True).sum(dim=1) + 1
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    assert torch.allclose(compiled(q, k, v), model(q, k, v), atol=1e-5)
