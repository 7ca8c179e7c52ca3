"""attn's functions as torch custom operators (torch.library.custom_op), so that they run in
eager mode and inside torch.compile(fullgraph=True) without graph breaks: the compiler sees
each as one opaque operator, whose output shapes and strides the fake implementations give.

    attn::scaled_dot_product_attention   the attention core
    attn::attention_layer                the fused layer (padded batches)
    attn::attention_layer_packed         the fused layer over packed sequences (cu_seqlens)
"""
import weakref

import torch

from . import _WEIGHTS, AttentionLayer, _core

Tensor = torch.Tensor


@torch.library.custom_op("attn::scaled_dot_product_attention", mutates_args=())
def _sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
          is_causal: bool, scale: float | None, variant: str, precision: str, allow_storage_only: bool) -> Tensor:
    return _core(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision, allow_storage_only)


@_sdpa.register_fake
def _(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision, allow_storage_only):
    batch, heads, s_q, d = q.shape
    return q.new_empty((batch, s_q, heads, d)).transpose(1, 2)  # the kernels' layout, as _core returns it


def scaled_dot_product_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision,
                                 allow_storage_only):
    return _sdpa(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision, allow_storage_only)


# The operator takes the weights as tensors (the compiler sees them as inputs) and runs the
# caller's AttentionLayer of those weights: a layer is found by its weights' storage, weakly
# (it keeps its weights alive, and the caller decides how long). A layer whose weights were
# changed in place since it prepared them (their version moved) prepares them again when
# it runs (AttentionLayer._layer), in its own precision and variant.
_layers = weakref.WeakValueDictionary()


def _key(weights, num_heads, eps, causal, variant):
    return (tuple((w.data_ptr(), tuple(w.shape), str(w.device)) for w in weights), num_heads, eps, causal, variant)


def remember(layer):
    """Lets the operators find `layer` by its weights."""
    _layers[_key([layer.weights[name] for name in _WEIGHTS], layer.num_heads, layer.layer_norm_eps, layer.causal,
                 layer.variant)] = layer


def _layer_for(weights, num_heads, eps, causal, variant):
    layer = _layers.get(_key(weights, num_heads, eps, causal, variant))
    if layer is None:  # weights no layer of the caller's stands for (yet): one for this call
        layer = AttentionLayer(*weights, num_heads=num_heads, layer_norm_eps=eps, causal=causal, variant=variant)
    return layer


@torch.library.custom_op("attn::attention_layer", mutates_args=())
def _layer_op(x: Tensor, weights: list[Tensor], attention_mask: Tensor | None, bias: Tensor | None, num_heads: int,
              eps: float, causal: bool, output_probs: bool, variant: str) -> tuple[Tensor, Tensor]:
    layer = _layer_for(weights, num_heads, eps, causal, variant)
    result = layer._forward(x, attention_mask, bias, output_probs)
    if output_probs:
        return result
    return result, x.new_empty((0,))


@_layer_op.register_fake
def _(x, weights, attention_mask, bias, num_heads, eps, causal, output_probs, variant):
    probs_shape = (x.shape[0], num_heads, x.shape[1], x.shape[1]) if output_probs else (0,)
    return x.new_empty(x.shape), x.new_empty(probs_shape)


# Packed sequences (the probabilities, whose size depends on the offsets' values, are left to
# AttentionLayer's own path, outside torch.compile's graphs).
@torch.library.custom_op("attn::attention_layer_packed", mutates_args=())
def _packed_op(x: Tensor, weights: list[Tensor], cu_seqlens: Tensor, bias: Tensor | None, num_heads: int, eps: float,
               causal: bool, variant: str) -> Tensor:
    return _layer_for(weights, num_heads, eps, causal, variant)._forward_packed(x, cu_seqlens, bias, False)


@_packed_op.register_fake
def _(x, weights, cu_seqlens, bias, num_heads, eps, causal, variant):
    return x.new_empty(x.shape)


def _weights_of(layer):
    if not torch.compiler.is_compiling():  # this layer serves the operator's calls with these weights
        remember(layer)
    return [layer.weights[name] for name in _WEIGHTS]


def attention_layer(layer, x, attention_mask, bias, output_probs):
    y, probs = _layer_op(x, _weights_of(layer), attention_mask, bias, layer.num_heads, layer.layer_norm_eps,
                         layer.causal, output_probs, layer.variant)
    return (y, probs) if output_probs else y


def attention_layer_packed(layer, x, cu_seqlens, bias):
    return _packed_op(x, _weights_of(layer), cu_seqlens, bias, layer.num_heads, layer.layer_norm_eps, layer.causal,
                      layer.variant)
