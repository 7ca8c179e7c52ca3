"""Hugging Face transformers integration.

    attn.hf.patch(model)      every BERT-family self-attention block (BertAttention: .self with
                              query/key/value, .output with dense and LayerNorm; BERT, RoBERTa,
                              all-MiniLM-L6-v2, ...) runs as attn's fused layer, and every
                              layer around one (BertLayer) runs on the real tokens only
    attn.hf.unpatch(model)    puts the original blocks back
    attn.hf.register()        the attention core as attn_implementation="attn"
                              (transformers' AttentionInterface), for models that route
                              attention through it (grouped-query heads are repeated)

A patched block computes exactly what the module computes in inference (dropout off). Its
weight matrices are prepared when it is patched (in the fused layer's layout; on a GPU copied to the device),
and prepared again at the next call after new weights are loaded into the model in place
(load_state_dict copies into the parameters: their version moves). Only BERT's block
exactly is patched (its submodules and nothing else), not a relative with more in it (e.g.
Nystromformer's convolution). Padded
batches (right padding, transformers' default) are computed without their padding: a
patched BertLayer packs the real tokens, runs its attention as the packed fused layer and
its own feed-forward on them, and scatters the result back, so that its outputs at padded
positions are zeros (what they are does not matter: no real token reads them). A block
called with a cache (generation) or encoder states falls back to its own forward. Inference
only: with autograd recording and parameters that require grad, a call raises (use
torch.inference_mode() or torch.no_grad()). A patched block does not return attention
probabilities (output_attentions records none for it).
"""
import os
import types
import warnings

import torch

from . import AttentionLayer, _check_core_precision, scaled_dot_product_attention

_LAYER = "_attn_layer"
_PREVIOUS = "_attn_previous_forward"  # an instance's own forward attribute before patch() (a hook's)


def _children(module):
    return {name for name, _ in module.named_children()}


def _is_bert_attention(module):
    """BERT's attention block exactly: query/key/value Linears and dropout, then dense,
    LayerNorm and dropout, and nothing else (a family member with more, e.g. Nystromformer's
    convolution, computes something else and is left alone)."""
    s, o = getattr(module, "self", None), getattr(module, "output", None)
    return (isinstance(s, torch.nn.Module) and isinstance(o, torch.nn.Module)
            and _children(module) == {"self", "output"}
            and type(s).__name__.endswith("SelfAttention") and _children(s) <= {"query", "key", "value", "dropout"}
            and all(isinstance(getattr(s, n, None), torch.nn.Linear) for n in ("query", "key", "value"))
            and _children(o) <= {"dense", "LayerNorm", "dropout"}
            and isinstance(getattr(o, "dense", None), torch.nn.Linear)
            and isinstance(getattr(o, "LayerNorm", None), torch.nn.LayerNorm)
            and not getattr(module, "is_cross_attention", False))


def _keys_only(mask):
    """A [B, 1, S_q, S_k] mask whose rows are all alike (a padding mask that transformers
    expanded) as [B, 1, 1, S_k]; any other mask as it is."""
    if mask is not None and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] > 1:
        first = mask[:, :, :1, :]
        if mask.stride(2) == 0 or bool((mask == first).all()):
            return first
    return mask


def _is_bert_layer(module):
    return (isinstance(getattr(module, "attention", None), torch.nn.Module) and _is_bert_attention(module.attention)
            and _children(module) == {"attention", "intermediate", "output"}
            and callable(getattr(module, "feed_forward_chunk", None)))


def _masks(layer, hidden_states, attention_mask):
    """transformers' attention mask as attn's: a key padding mask [B, S] (or None) and a bias."""
    batch, seq = hidden_states.shape[:2]
    mask = _keys_only(attention_mask)
    if mask is None:
        return None, None
    if mask.dim() == 2:  # [B, S] (1 = real token), as older versions pass it
        return mask, None
    from . import _core_masks
    return _core_masks(mask, None, batch, layer.num_heads, seq, seq, hidden_states)


def _own_forward(self, *args, **kwargs):
    """The module's forward as it was before patch(): its class's, or an earlier instance
    attribute (a hook's wrapper) that patch() kept."""
    previous = vars(self).get(_PREVIOUS)
    return previous(*args, **kwargs) if previous is not None else type(self).forward(self, *args, **kwargs)


def _mask_of_plain_call(args, kwargs):
    """(the attention mask, whether the call passes nothing else that matters: no encoder
    states, no cache), from a block's forward arguments after hidden_states."""
    attention_mask = args[0] if args else kwargs.get("attention_mask")
    others = list(args[1:]) + [v for k, v in kwargs.items() if k not in ("attention_mask", "output_attentions")]
    return attention_mask, all(v is None or v is False for v in others)


def _fused_layer_forward(self, hidden_states, *args, **kwargs):
    """A whole BertLayer on the real tokens only: a right-padded batch is packed, its
    attention runs as the packed fused layer and its feed-forward on the packed tokens, and
    the result is scattered back (zeros at padded positions). Any other call (encoder states,
    a cache, left padding, a general mask) runs the layer's own forward, with its arguments
    as given."""
    attention_mask, plain = _mask_of_plain_call(args, kwargs)
    layer = getattr(self.attention, _LAYER)
    if (not plain or getattr(self, "chunk_size_feed_forward", 0) or not layer._skips_padding
            or hidden_states.device.type != "cpu"):
        return _own_forward(self, hidden_states, *args, **kwargs)
    keys, bias = _masks(layer, hidden_states, attention_mask)
    from . import _right_padded
    if bias is not None or keys is None or not _right_padded(keys):
        return _own_forward(self, hidden_states, *args, **kwargs)
    real = keys.bool() if keys.dtype != torch.bool else keys
    lengths = real.sum(1, dtype=torch.int32)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    torch.cumsum(lengths, 0, out=offsets[1:])
    tokens = hidden_states[real]
    out = self.feed_forward_chunk(layer(tokens, cu_seqlens=offsets))
    padded = hidden_states.new_zeros(hidden_states.shape)
    padded[real] = out
    return padded


def _fused_forward(self, hidden_states, *args, **kwargs):
    attention_mask, plain = _mask_of_plain_call(args, kwargs)
    if not plain:  # encoder states, a cache: its own forward
        return _own_forward(self, hidden_states, *args, **kwargs)
    layer = getattr(self, _LAYER)
    keys, bias = _masks(layer, hidden_states, attention_mask)
    return layer(hidden_states, keys, bias=bias), None


def patch(model, variant=None, precision="fp32", allow_storage_only=False):
    """Swaps every BERT-family self-attention block of `model` for attn's fused layer, in place,
    computing in `precision` ("fp32", "bf16" or "int8", with allow_storage_only: AttentionLayer's). A
    model in torch.bfloat16 works in each. Returns how many blocks were patched (an error if
    none)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__module__}.{type(model).__name__}")
    if "OMP_WAIT_POLICY" not in os.environ and torch.get_num_threads() > 1:
        warnings.warn("attn.hf.patch: torch's OpenMP threads spin after each operator (libgomp's default) and take "
                      "the cores from attn's kernels in between; set OMP_WAIT_POLICY=PASSIVE before torch starts "
                      "(README, 'Using it from Python')", RuntimeWarning, stacklevel=2)
    def swap(module, forward):
        if "forward" in vars(module):  # a hook's wrapper: kept, for the fallback and for unpatch()
            setattr(module, _PREVIOUS, vars(module)["forward"])
        module.forward = types.MethodType(forward, module)

    patched = 0
    for module in model.modules():
        if _is_bert_attention(module) and not hasattr(module, _LAYER):
            setattr(module, _LAYER, AttentionLayer.from_hf(module, variant=variant, precision=precision,
                                                            allow_storage_only=allow_storage_only))
            swap(module, _fused_forward)
            patched += 1
    # The layers around them: padded batches packed, so that the feed-forward skips padding too.
    for module in model.modules():
        if (_is_bert_layer(module) and hasattr(module.attention, _LAYER)
                and getattr(vars(module).get("forward"), "__func__", None) is not _fused_layer_forward):
            swap(module, _fused_layer_forward)
    if patched == 0 and not any(hasattr(m, _LAYER) for m in model.modules()):
        raise ValueError(f"model: expected BERT-family attention blocks (BertAttention: .self.query/key/value, "
                         f".output.dense/LayerNorm), found none in {type(model).__name__}")
    return patched


def unpatch(model):
    """Undoes patch(): every block runs its own forward again. Returns how many."""
    def restore(module):
        del module.forward  # the instance's attribute: the class's forward shows again,
        if _PREVIOUS in vars(module):  # or the one that was there before
            module.forward = vars(module).pop(_PREVIOUS)

    restored = 0
    for module in model.modules():
        if hasattr(module, _LAYER):
            delattr(module, _LAYER)
            restore(module)
            restored += 1
        elif getattr(vars(module).get("forward"), "__func__", None) is _fused_layer_forward:
            restore(module)
    return restored


def patched(model):
    """The fused layers of a patched model, in module order."""
    return [getattr(m, _LAYER) for m in model.modules() if hasattr(m, _LAYER)]


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *, precision="fp32",
                      allow_storage_only=False, **kwargs):
    """transformers' AttentionInterface: query, key, value [B, heads, S, d]; returns the output
    [B, S, heads, d] and no probabilities. precision: scaled_dot_product_attention's."""
    if dropout:
        raise ValueError(f"dropout: attn computes inference only, got {dropout} (put the model in eval mode)")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key/value head serves a group
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    mask = attention_mask[..., : key.shape[2]] if attention_mask is not None else None
    mask = _keys_only(mask)
    # As transformers' SDPA path: causal when asked (or the module is) and no mask says otherwise.
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    is_causal = bool(is_causal) and mask is None and query.shape[2] > 1
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling,
                                       precision=precision, allow_storage_only=allow_storage_only)
    return out.transpose(1, 2), None


def register(name="attn", precision="fp32", allow_storage_only=False):
    """Registers the attention core with transformers as attn_implementation=`name`, with the
    boolean masks of its SDPA path: then from_pretrained(..., attn_implementation="attn") or
    model.set_attn_implementation("attn") uses it. precision="bf16": the core in bf16
    (scaled_dot_product_attention's precision); a model in torch.bfloat16 works in either."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    _check_core_precision(precision)

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, scaling, dropout, precision=precision,
                                 allow_storage_only=allow_storage_only, **kwargs)
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
