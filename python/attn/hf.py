"""Hugging Face transformers integration.

    attn.hf.patch(model)      every BERT-family self-attention block (BertAttention: .self with
                              query/key/value, .output with dense and LayerNorm; BERT, RoBERTa,
                              all-MiniLM-L6-v2, ...) runs as attn's fused layer, and every
                              layer around one (BertLayer) runs on the real tokens only
    attn.hf.unpatch(model)    puts the original blocks back
    attn.hf.register()        the attention core as attn_implementation="attn"
                              (transformers' AttentionInterface), for any model that routes
                              attention through it

A patched block computes exactly what the module computes in inference (dropout off): its
parameter tensors are used in place, so loading new weights into the model is seen. Padded
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

from . import AttentionLayer, scaled_dot_product_attention

_LAYER = "_attn_layer"


def _is_bert_attention(module):
    s, o = getattr(module, "self", None), getattr(module, "output", None)
    return (isinstance(s, torch.nn.Module) and isinstance(o, torch.nn.Module)
            and all(isinstance(getattr(s, n, None), torch.nn.Linear) for n in ("query", "key", "value"))
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
    return (_is_bert_attention(getattr(module, "attention", None) or torch.nn.Module())
            and isinstance(getattr(module, "intermediate", None), torch.nn.Module)
            and isinstance(getattr(module, "output", None), torch.nn.Module)
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


def _fused_layer_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                         encoder_attention_mask=None, cache=None, **kwargs):
    """A whole BertLayer on the real tokens only: a right-padded batch is packed, its
    attention runs as the packed fused layer and its feed-forward on the packed tokens, and
    the result is scattered back (zeros at padded positions)."""
    layer = getattr(self.attention, _LAYER)
    keys, bias = _masks(layer, hidden_states, attention_mask)
    if (encoder_hidden_states is not None or cache is not None or kwargs.get("past_key_values") is not None
            or getattr(self, "chunk_size_feed_forward", 0) or bias is not None or keys is None
            or not layer._skips_padding or hidden_states.device.type != "cpu"):
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states,
                                  encoder_attention_mask=encoder_attention_mask, cache=cache, **kwargs)
    from . import _right_padded
    real = keys.bool() if keys.dtype != torch.bool else keys
    if not _right_padded(real):
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states,
                                  encoder_attention_mask=encoder_attention_mask, cache=cache, **kwargs)
    lengths = real.sum(1, dtype=torch.int32)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    torch.cumsum(lengths, 0, out=offsets[1:])
    tokens = hidden_states[real]
    out = self.feed_forward_chunk(layer(tokens, cu_seqlens=offsets))
    padded = hidden_states.new_zeros(hidden_states.shape)
    padded[real] = out
    return padded


def _fused_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                   cache=None, **kwargs):
    if encoder_hidden_states is not None or cache is not None or kwargs.get("past_key_values") is not None:
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                  cache, **kwargs)
    layer = getattr(self, _LAYER)
    keys, bias = _masks(layer, hidden_states, attention_mask)
    return layer(hidden_states, keys, bias=bias), None


def patch(model, variant=None):
    """Swaps every BERT-family self-attention block of `model` for attn's fused layer, in place.
    Returns how many blocks were patched (an error if none)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__module__}.{type(model).__name__}")
    if "OMP_WAIT_POLICY" not in os.environ and torch.get_num_threads() > 1:
        warnings.warn("attn.hf.patch: torch's OpenMP threads spin after each operator (libgomp's default) and take "
                      "the cores from attn's kernels in between; set OMP_WAIT_POLICY=PASSIVE before torch starts "
                      "(README, 'Using it from Python')", RuntimeWarning, stacklevel=2)
    patched = 0
    for module in model.modules():
        if _is_bert_attention(module) and not hasattr(module, _LAYER):
            setattr(module, _LAYER, AttentionLayer.from_hf(module, variant=variant))
            module.forward = types.MethodType(_fused_forward, module)
            patched += 1
    # The layers around them: padded batches packed, so that the feed-forward skips padding too.
    for module in model.modules():
        if _is_bert_layer(module) and hasattr(module.attention, _LAYER) and "forward" not in vars(module):
            module.forward = types.MethodType(_fused_layer_forward, module)
    if patched == 0 and not any(hasattr(m, _LAYER) for m in model.modules()):
        raise ValueError(f"model: expected BERT-family attention blocks (BertAttention: .self.query/key/value, "
                         f".output.dense/LayerNorm), found none in {type(model).__name__}")
    return patched


def unpatch(model):
    """Undoes patch(): every block runs its own forward again. Returns how many."""
    restored = 0
    for module in model.modules():
        if hasattr(module, _LAYER):
            delattr(module, _LAYER)
            del module.forward  # the instance's attribute: the class's forward shows again
            restored += 1
        elif getattr(vars(module).get("forward"), "__func__", None) is _fused_layer_forward:
            del module.forward
    return restored


def patched(model):
    """The fused layers of a patched model, in module order."""
    return [getattr(m, _LAYER) for m in model.modules() if hasattr(m, _LAYER)]


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' AttentionInterface: query, key, value [B, heads, S, d]; returns the output
    [B, S, heads, d] and no probabilities."""
    if dropout:
        raise ValueError(f"dropout: attn computes inference only, got {dropout} (put the model in eval mode)")
    mask = _keys_only(attention_mask)
    is_causal = bool(getattr(module, "is_causal", False)) and mask is None and query.shape[2] > 1
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling)
    return out.transpose(1, 2), None


def register(name="attn"):
    """Registers the attention core with transformers as attn_implementation=`name`, with the
    boolean masks of its SDPA path: then from_pretrained(..., attn_implementation="attn") or
    model.set_attn_implementation("attn") uses it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
