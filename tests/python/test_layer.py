"""attn.AttentionLayer: the fused layer against the float64 reference, padded, unpadded and
packed, from transformers' BertAttention, errors, and torch.compile."""
import numpy as np
import pytest
import torch

import attn
from conftest import assert_accurate, cpu_variants, random_weights, reference_layer

HIDDEN, HEADS, EPS = 64, 4, 1e-12


def layer_and_input(batch=3, seq=11, variant=None, causal=False, framework="torch"):
    w = random_weights(HIDDEN)
    x = torch.randn(batch, seq, HIDDEN, generator=torch.Generator().manual_seed(3))
    given = w if framework == "torch" else {n: a.numpy() for n, a in w.items()}
    layer = attn.AttentionLayer(*(given[n] for n in attn._WEIGHTS), num_heads=HEADS, layer_norm_eps=EPS,
                                causal=causal, variant=variant)
    return layer, w, x


def check(actual, x, w, what, **kwargs):
    exact = reference_layer(x.double(), w, HEADS, EPS, **kwargs)
    plain = reference_layer(x, w, HEADS, EPS, **kwargs)
    assert_accurate(actual, exact, plain, what)


@pytest.mark.parametrize("variant", cpu_variants("attention_layer"))
def test_every_variant_matches_the_reference(variant):
    layer, w, x = layer_and_input(variant=variant)
    assert layer.variant == variant
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[1, 6:] = 0
    mask[2, 1:] = 0
    y = layer(x, mask)
    real = mask.bool()
    # Rows at padded positions are not computed without padding: compare the real tokens.
    expected = reference_layer(x.double(), w, HEADS, EPS, keys=real)[real]
    plain = reference_layer(x, w, HEADS, EPS, keys=real)[real]
    assert_accurate(y[real], expected, plain, variant)
    if "attention_layer_packed" in attn.select(variant)["functions"]:  # computed without the padding
        assert torch.equal(y[~real], torch.zeros_like(y[~real]))


def test_numpy_layer_and_left_padding():
    layer, w, x = layer_and_input(framework="numpy")
    mask = np.ones((3, 11), dtype=np.uint8)
    mask[0, :4] = 0  # left padding: computed with the mask, every row
    y = layer(x.numpy(), mask)
    assert isinstance(y, np.ndarray)
    check(y, x, w, "left padded", keys=torch.from_numpy(mask).bool())


def test_causal_bias_and_probabilities():
    layer, w, x = layer_and_input(causal=True)
    bias = torch.randn(1, HEADS, 11, 11, generator=torch.Generator().manual_seed(5))
    y, probs = layer(x, bias=bias, output_attentions=True)
    check(y, x, w, "causal with bias", bias=bias, causal=True)
    assert probs.shape == (3, HEADS, 11, 11)
    assert torch.allclose(probs.sum(-1), torch.ones(3, HEADS, 11), atol=1e-5)
    assert (probs.triu(diagonal=1) == 0).all()


def test_a_bias_per_batch_with_right_padding():
    layer, w, x = layer_and_input()
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, 6:] = False
    bias = torch.randn(3, HEADS, 11, 11, generator=torch.Generator().manual_seed(8))
    y = layer(x, mask, bias=bias)  # not the unpadded path, which takes a bias of batch 1 only
    check(y, x, w, "bias per batch", keys=mask, bias=bias)


def test_layers_are_found_by_their_weights_weakly():
    import gc
    import weakref
    layer, w, x = layer_and_input()
    layer(x)
    alive = weakref.ref(layer)
    del layer
    gc.collect()
    assert alive() is None, "the operators' table keeps a layer (and its weights) alive"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_weights_changed_in_place_are_prepared_again(precision):
    # The layer prepared its matrices when it was made; torch weights changed in place since
    # (their version moved) are prepared again at the next call, in the layer's own precision,
    # on every path: dense, and packed with the probabilities (which leaves torch's operator).
    w = random_weights(HIDDEN)
    x = torch.randn(2, 11, HIDDEN, generator=torch.Generator().manual_seed(3))
    offsets = torch.tensor([0, 4, 11], dtype=torch.int32)
    layer = attn.AttentionLayer(*(w[n] for n in attn._WEIGHTS), num_heads=HEADS, layer_norm_eps=EPS,
                                precision=precision, allow_storage_only=True)
    before = layer(x)
    with torch.no_grad():
        w["w_v"].mul_(-0.5)
        w["w_o"].add_(0.01)
    fresh = attn.AttentionLayer(*(w[n] for n in attn._WEIGHTS), num_heads=HEADS, layer_norm_eps=EPS,
                                precision=precision, allow_storage_only=True, variant=layer.variant)
    after = layer(x)
    assert layer.precision == precision and torch.equal(after, fresh(x)) and not torch.allclose(after, before)
    if precision == "fp32":
        check(after, x, w, "after changing w_v and w_o in place")
    probs = precision == "fp32"  # (a reduced precision has no probabilities)
    packed = x[0, :11]
    assert all(map(torch.equal, layer(packed, cu_seqlens=offsets, output_attentions=probs),
                   fresh(packed, cu_seqlens=offsets, output_attentions=probs)))


def test_packed_sequences_match_each_sequence_alone():
    layer, w, _ = layer_and_input()
    lengths = [5, 0, 9, 1]
    g = torch.Generator().manual_seed(9)
    sequences = [torch.randn(1, n, HIDDEN, generator=g) for n in lengths]
    packed = torch.cat([s[0] for s in sequences])
    offsets = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    y, probs = layer(packed, cu_seqlens=offsets, output_attentions=True)
    assert y.shape == packed.shape and probs.numel() == HEADS * sum(n * n for n in lengths)
    for n, s, start in zip(lengths, sequences, offsets[:-1].tolist()):
        if n:
            check(y[start:start + n][None], s, w, f"sequence of {n}")


def test_from_hf_matches_the_module():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=128,
                                     num_hidden_layers=1, attn_implementation="eager")
    module = transformers.models.bert.modeling_bert.BertAttention(config).eval()
    layer = attn.AttentionLayer.from_hf(module)
    x = torch.randn(2, 9, HIDDEN, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        expected = module(x)[0]
        actual = layer(x)
    assert torch.allclose(actual, expected, atol=1e-5)
    with pytest.raises(RuntimeError, match="w_q: attn computes inference only"):
        layer(x)  # the module's parameters require grad, and autograd is recording
    with pytest.raises(TypeError, match="module: expected a transformers BertAttention"):
        attn.AttentionLayer.from_hf(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("call, error, message", [
    (lambda l, x: l(x[..., :-1]), attn.Error, "hidden_states: expected shape [3, 11, 64] [B, S_q, H], got [3, 11, 63]"),
    (lambda l, x: l(x.double()), TypeError, "hidden_states: expected dtype float32, got float64"),
    (lambda l, x: l(x, torch.ones(3, 10, dtype=torch.bool)), attn.Error, "attention_mask: expected shape [3, 11]"),
    (lambda l, x: l(x, torch.ones(3, 11)), TypeError, "attention_mask: expected a bool or integer mask"),
    (lambda l, x: l(x[0], cu_seqlens=torch.tensor([0, 11])), TypeError, "cu_seqlens: expected dtype int32, got int64"),
    (lambda l, x: l(x[0], cu_seqlens=torch.tensor([0, 12], dtype=torch.int32)), attn.Error, "cu_seqlens"),
    (lambda l, x: l(x, bias=torch.zeros(1, 5, 11, 11)), attn.Error, "bias: expected shape"),
    (lambda l, x: l(x.numpy()), TypeError, "hidden_states: expected a torch.Tensor like the weights"),
])
def test_bad_input_names_the_argument(call, error, message):
    layer, _, x = layer_and_input()
    with pytest.raises(error) as caught:
        call(layer, x)
    assert message in str(caught.value)


def test_bad_weights_name_the_argument():
    w = random_weights(HIDDEN)
    args = [w[n] for n in attn._WEIGHTS]
    with pytest.raises(ValueError, match="num_heads: expected a divisor of hidden_size 64, got 5"):
        attn.AttentionLayer(*args, num_heads=5)
    args[7] = torch.zeros(HIDDEN + 1)
    with pytest.raises(attn.Error, match=r"b_o: expected shape \[64\]"):
        attn.AttentionLayer(*args, num_heads=HEADS)


def test_torch_compile_fullgraph_packed():
    layer, w, x = layer_and_input()
    offsets = torch.tensor([0, 4, 4, 11], dtype=torch.int32)

    def model(tokens, offsets):
        return layer(tokens + 1, cu_seqlens=offsets) * 2
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x[0], offsets), model(x[0], offsets), atol=1e-6)


def test_torch_compile_fullgraph():
    layer, w, x = layer_and_input()
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[0, 7:] = 0

    def model(x, mask):
        return layer(x * 1.5, mask).relu()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x, mask), model(x, mask), atol=1e-6)


def available(precision):
    return any(f"attention_layer_{precision}" in v["functions"] and v["runnable"] for v in attn.variants())


def bf16_available():
    return available("bf16")


# How far each reduced precision moves y from fp32 here, at most (tests/test_precision.cpp
# bounds it): rounded weights and inputs (u = 2^-8) by about 1e-3 (measured 0.0087); quantized
# ones by 0.048 (measured on a Zen 3 with the weights in 7 bits, attn::kInt8WeightLimit; 0.024
# with 8: at this small width a step is a large share of a row's range).
LARGEST_DIFFERENCE = {"bf16": 0.05, "int8": 0.05}


@pytest.mark.parametrize("precision", LARGEST_DIFFERENCE)
def test_reduced_precision_layer_is_close_to_fp32_and_not_it(precision):
    if not available(precision):
        pytest.skip(f"this build has no runnable {precision} variant (arm64: built_for)")
    layer, w, x = layer_and_input()
    reduced = attn.AttentionLayer(*(w[n] for n in attn._WEIGHTS), num_heads=HEADS, layer_norm_eps=EPS,
                                  precision=precision, allow_storage_only=True)
    assert reduced.precision == precision and precision in repr(reduced)
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[1, 6:] = 0
    y, y32 = reduced(x, mask), layer(x, mask)
    real = mask.bool()
    difference = (y[real] - y32[real]).abs().max().item()
    # A layer equal to fp32 would have computed in fp32.
    assert 1e-5 < difference < LARGEST_DIFFERENCE[precision], difference
    # Packed: each token's row as in the padded batch (the quantization is per token row).
    offsets = torch.tensor([0, 4, 11], dtype=torch.int32)
    packed = reduced(x[0], cu_seqlens=offsets)
    assert torch.allclose(packed[:4], reduced(x[0:1, :4])[0], atol=1e-5)
    with pytest.raises(attn.Error, match="^output_attentions: "):
        reduced(x, mask, output_attentions=True)
    with pytest.raises(ValueError, match="^precision: expected one of 'fp32', 'bf16', 'int8', got 'fp16'"):
        attn.AttentionLayer(*(w[n] for n in attn._WEIGHTS), num_heads=HEADS, precision="fp16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bfloat16_tensors_are_widened_and_the_result_rounded(precision):
    """A model in torch.bfloat16: its weights and inputs widened to float32 (exactly), the
    result rounded back; the same as the float32 layer on the widened values."""
    if precision == "bf16" and not bf16_available():
        pytest.skip("this build has no runnable bf16 variant (arm64: built_for)")
    _, w, x = layer_and_input()
    w16 = {n: a.to(torch.bfloat16) for n, a in w.items()}
    x16 = x.to(torch.bfloat16)
    make = lambda ws: attn.AttentionLayer(*(ws[n] for n in attn._WEIGHTS), num_heads=HEADS,  # noqa: E731
                                          layer_norm_eps=EPS, precision=precision, allow_storage_only=True)
    layer16, layer32 = make(w16), make({n: a.float() for n, a in w16.items()})
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[1, 6:] = 0
    y = layer16(x16, mask)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.equal(y, layer32(x16.float(), mask).to(torch.bfloat16))
    offsets = torch.tensor([0, 4, 11], dtype=torch.int32)
    packed = layer16(x16[0], cu_seqlens=offsets)
    assert packed.dtype == torch.bfloat16
    assert torch.equal(packed, layer32(x16[0].float(), cu_seqlens=offsets).to(torch.bfloat16))
    if precision == "fp32":
        y, probs = layer16(x16, mask, output_attentions=True)
        assert y.dtype == probs.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="^hidden_states: expected dtype float32, got float16"):
        layer16(x.half(), mask)
