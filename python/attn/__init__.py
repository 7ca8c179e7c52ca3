"""attn: BERT self-attention compiled ahead of time with Halide, for NumPy and PyTorch.

    import attn
    out = attn.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # as torch's
    layer = attn.AttentionLayer.from_hf(bert_attention)                # the fused layer
    y = layer(hidden_states, attention_mask)
    attn.hf.patch(model)                                               # a whole model

Arrays are NumPy arrays or torch tensors (CPU; CUDA memory for the CUDA variants), float32;
masks bool or integer (1 = take part). Results come back in the inputs' framework. The
kernels read the caller's memory in place where its layout allows: a C-contiguous array, or
for scaled_dot_product_attention [B, heads, S, d] views of [B, S, heads, d] memory (what
transformers' view(...).transpose(1, 2) makes). Anything else is copied once into that
layout first. Errors are TypeError (dtype) or ValueError (attn.Error for the runtime's
checks), naming the argument, the expected and the actual.

The variant (a CPU instruction set's build with a schedule source, or a GPU one) is chosen
as the C++ runtime chooses it (attn.select()); `variant=` names one (attn.variants()).
The kernels release the GIL; one layer may be called from several threads at once.
"""
import math
import sys

import numpy as np

from . import _attn
from ._attn import MAX_THREADS, Error, default_variant_reason, num_threads, release_scratch_memory, set_num_threads

__all__ = ["AttentionLayer", "Error", "MAX_THREADS", "default_variant_reason", "num_threads",
           "release_scratch_memory", "scaled_dot_product_attention", "select", "set_num_threads", "variants"]


def variants():
    """Every compiled variant (dicts: name, schedule, isa, target, device, functions, runnable,
    not_runnable_reason), by instruction set, then schedule source."""
    return _attn.variants()


def select(variant=None):
    """The variant a call with `variant` (None: this machine's default) runs."""
    return _attn.select(variant or "")


# --- arrays of either framework -------------------------------------------------------------

def _torch():
    return sys.modules.get("torch")  # only if the caller has imported it: attn does not need torch


def _is_torch(a):
    torch = _torch()
    return torch is not None and isinstance(a, torch.Tensor)


def _is_cuda(a):
    return _is_torch(a) and a.device.type == "cuda"


def _describe(a):
    return f"{type(a).__module__}.{type(a).__name__}"


def _dtype(a):
    """An array's dtype by its NumPy name ("float32", "bool", ...), whichever its framework."""
    return str(a.dtype).replace("torch.", "")


def _as_array(name, a, dtype="float32"):
    """`a` as a NumPy array or torch tensor of `dtype` ('float32', 'int32' or 'mask'), unchanged
    when it already is one; a TypeError naming `name` otherwise."""
    if a is None:
        return None
    if not _is_torch(a) and not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array or torch tensor, got {_describe(a)}")
    kind = _dtype(a)
    if dtype in ("float32", "int32"):
        if kind != dtype:
            raise TypeError(f"{name}: expected dtype {dtype}, got {kind}")
    elif dtype == "mask":
        if kind not in ("bool", "uint8", "int8", "int16", "int32", "int64"):
            raise TypeError(f"{name}: expected a bool or integer mask (1 = take part), got dtype {kind}")
    return a


def _widened(name, a):
    """A float32 tensor or array for `a`: a torch bfloat16 tensor widened to a float32 copy
    (exact: every bf16 value is a float32), anything else checked as float32, unchanged."""
    if _is_torch(a) and a.dtype == _torch().bfloat16:
        with _torch().inference_mode(False):  # a plain tensor, with the version the operators key on
            return a.detach().float()
    return _as_array(name, a)


def _check_no_grad(named):
    """Inference only: with autograd recording, a tensor that requires grad is an error
    (the kernels have no backward)."""
    torch = _torch()
    if torch is None or not torch.is_grad_enabled():
        return
    for name, a in named:
        if _is_torch(a) and a.requires_grad:
            raise RuntimeError(f"{name}: attn computes inference only, and this tensor requires grad "
                               "(call it under torch.no_grad() or torch.inference_mode())")


def _contiguous(a):
    if _is_torch(a):
        return a.contiguous()
    return np.ascontiguousarray(a)


def _empty(like, shape):
    """An uninitialized float32 array of `shape` in `like`'s framework and device."""
    if _is_torch(like):
        return _torch().empty(shape, dtype=_torch().float32, device=like.device)
    return np.empty(shape, dtype=np.float32)


def _mask_bytes(a):
    """A mask (bool, or integers with 1 = take part) as a C-contiguous bool array."""
    if _is_torch(a):
        return (a if a.dtype == _torch().bool else a != 0).contiguous()
    return np.ascontiguousarray(a if a.dtype == np.bool_ else a != 0)


def _shape(a):
    return tuple(int(n) for n in a.shape)


def _check_device(name, a, reference_name, reference):
    if _is_torch(a) != _is_torch(reference):
        raise TypeError(f"{name}: expected a {_describe(reference)} like {reference_name}, got {_describe(a)}")
    if _is_torch(a) and a.device != reference.device:
        raise ValueError(f"{name}: expected device {reference.device} like {reference_name}, got {a.device}")


def _renamed(error, names):
    """`error` (from the C++ runtime, whose message starts with its argument) with the argument
    renamed as the caller named it (`names`: runtime name -> caller's name)."""
    message = str(error)
    argument, _, rest = message.partition(": ")
    if argument not in names:
        return error
    renamed = type(error)(f"{names[argument]}: {rest}")
    if hasattr(error, "argument"):
        renamed.argument = names[argument]
    return renamed


def _call(names, function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except (Error, TypeError, ValueError) as e:
        raise _renamed(e, names) from None


def _variant_for(variant, a, name):
    """The variant a call on `a` runs when the caller names none: the C++ runtime's pick for
    this CPU, or for CUDA tensors the first CUDA variant this machine runs."""
    if variant or not _is_cuda(a):
        return variant or ""
    for v in _attn.variants():
        if v["device"] == "cuda" and v["runnable"]:
            return v["name"]
    reasons = {v["name"]: v["not_runnable_reason"] for v in _attn.variants() if v["device"] == "cuda"}
    raise ValueError(f"{name}: a tensor on {a.device}, but no CUDA variant runs here "
                     f"({reasons or 'none was compiled'})")


def _cuda_call(a, function, *args):
    """A call on CUDA memory: torch's queued work finished first, as Halide queues the kernels
    on its own stream (the caller then waits for them, so results are ready for torch)."""
    if not _is_cuda(a):
        return function(*args)
    _torch().cuda.current_stream(a.device).synchronize()
    return function(*args)


# --- the attention core ------------------------------------------------------------------

def _core_masks(attn_mask, key_padding_mask, batch, heads, s_q, s_k, reference):
    """attn_mask (torch's: bool, True = take part, or additive float, broadcastable to
    [B, heads, S_q, S_k]) and key_padding_mask [B, S_k] as the runtime takes them: a key
    padding mask [B, S_k], and an additive bias [B or 1, heads or 1, S_q, S_k]. A mask that
    only excludes keys (the same for every query and head, values 0 or -inf / its type's lowest)
    becomes the key padding mask, which costs nothing and gives a fully masked row zeros. A
    torch.bfloat16 mask is widened to float32."""
    keys = None
    if key_padding_mask is not None:
        key_padding_mask = _as_array("key_padding_mask", key_padding_mask, "mask")
        _check_device("key_padding_mask", key_padding_mask, "q", reference)
        if _shape(key_padding_mask) != (batch, s_k):
            raise ValueError(f"key_padding_mask: expected shape [{batch}, {s_k}] [B, S_k], "
                             f"got {list(_shape(key_padding_mask))}")
        keys = _mask_bytes(key_padding_mask)
    bias = None
    if attn_mask is not None:
        _check_device("attn_mask", attn_mask, "q", reference)
        is_bool = _dtype(attn_mask) == "bool"
        lowest = np.finfo(np.float32).min  # what excludes a key, in the mask's own type
        if not is_bool:
            if _is_torch(attn_mask) and attn_mask.dtype == _torch().bfloat16:  # a bf16 model's mask
                lowest = _torch().finfo(_torch().bfloat16).min
            attn_mask = _widened("attn_mask", attn_mask)
        shape = _shape(attn_mask)
        full = (batch, heads, s_q, s_k)
        padded = (1,) * (4 - len(shape)) + shape
        if len(shape) > 4 or any(m not in (1, f) for m, f in zip(padded, full)):
            raise ValueError(f"attn_mask: expected a shape broadcastable to {list(full)} [B, heads, S_q, S_k], "
                             f"got {list(shape)}")
        mask4 = attn_mask.reshape(padded)
        key_only = None
        if padded[1] == 1 and padded[2] == 1 and padded[3] == s_k:  # [B or 1, 1, 1, S_k]: keys only, if
            # its values allow
            row = mask4.reshape(padded[0], s_k)
            if is_bool:
                key_only = row
            else:
                excluded = row <= lowest
                if bool(((row == 0) | excluded).all()):
                    key_only = ~excluded
        if key_only is not None:
            if padded[0] == 1:
                key_only = (key_only.expand(batch, s_k) if _is_torch(key_only)
                            else np.broadcast_to(key_only, (batch, s_k)))
            key_only = _mask_bytes(key_only)
            keys = key_only if keys is None else _mask_bytes(keys & key_only)
        else:
            if is_bool:
                if _is_torch(mask4):
                    torch = _torch()
                    mask4 = torch.zeros(padded, dtype=torch.float32, device=mask4.device).masked_fill(
                        ~mask4, float("-inf"))
                else:
                    mask4 = np.where(mask4, np.float32(0), np.float32(-np.inf))
            target = (padded[0], padded[1], s_q, s_k)
            if _is_torch(mask4):
                bias = mask4.expand(target).contiguous()
            else:
                bias = np.ascontiguousarray(np.broadcast_to(mask4, target))
    return keys, bias


def _core(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision="fp32",
          allow_storage_only=False):
    """scaled_dot_product_attention on checked float32 arrays of one framework: the output
    [B, heads, S_q, d], a view of [B, S_q, heads, d] memory."""
    batch, heads, s_q, d = _shape(q)
    s_k = _shape(k)[2]
    # [B, S, heads, d] memory, viewed as the runtime's [B, S, H]: in place for transposed views.
    def interleaved(a):
        t = a.transpose(1, 2) if _is_torch(a) else a.transpose(0, 2, 1, 3)
        return _contiguous(t).reshape(t.shape[0], t.shape[1], heads * d)
    q3, k3, v3 = interleaved(q), interleaved(k), interleaved(v)
    if scale is not None and not math.isclose(float(scale), 1.0 / math.sqrt(d), rel_tol=1e-6):
        # The kernels scale by 1/sqrt(d); another scale is folded into a copy of q.
        q3 = q3 * np.float32(float(scale) * math.sqrt(d))
    keys, bias = _core_masks(attn_mask, key_padding_mask, batch, heads, s_q, s_k, q)
    out = _empty(q, (batch, s_q, heads, d))
    variant = _variant_for(variant, q, "q")
    _call({"bias": "attn_mask", "out": "q", "hidden_size": "q", "num_heads": "q"}, _cuda_call, q,
          _attn.attention_core, variant, heads * d, heads, bool(is_causal), q3, k3, v3,
          out.reshape(batch, s_q, heads * d), keys, bias, precision, bool(allow_storage_only))
    if _is_cuda(q):
        _attn.synchronize(variant)
    out = out.transpose(1, 2) if _is_torch(out) else out.transpose(0, 2, 1, 3)
    if bias is not None:
        # A query whose every key the mask excludes (all -inf) gets zeros, as from the key
        # padding mask and as torch gives; the kernels' online softmax would average V there.
        empty = (bias == -np.inf).all(-1)[..., None]  # [B or 1, heads or 1, S_q, 1]
        if bool(empty.any()):
            out = out.masked_fill(empty, 0.0) if _is_torch(out) else np.where(empty, np.float32(0), out)
    return out


def _check_core_inputs(q, k, v):
    for name, a in (("q", q), ("k", k), ("v", v)):
        _as_array(name, a)
        if a.ndim != 4:
            raise ValueError(f"{name}: expected 4 dimensions [B, heads, S, d], got shape {list(_shape(a))}")
    _check_device("k", k, "q", q)
    _check_device("v", v, "q", q)
    batch, heads, _, d = _shape(q)
    s_k = _shape(k)[2]
    if _shape(k) != (batch, heads, s_k, d):
        raise ValueError(f"k: expected shape [{batch}, {heads}, S_k, {d}] [B, heads, S_k, d] as q, "
                         f"got {list(_shape(k))}")
    if _shape(v) != (batch, heads, s_k, d):
        raise ValueError(f"v: expected shape [{batch}, {heads}, {s_k}, {d}] [B, heads, S_k, d] as k, "
                         f"got {list(_shape(v))}")


# The attention core's precisions (attn::stages::attention_core); int8 is the whole layer's only.
CORE_PRECISIONS = ("fp32", "bf16")


def _check_core_precision(precision):
    """The attention core's precisions: int8 is one of the whole layer's (AttentionLayer)."""
    if precision not in CORE_PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(map(repr, CORE_PRECISIONS))} (int8 is a "
                         f"precision of the whole layer, AttentionLayer), got {precision!r}")


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, *, key_padding_mask=None,
                                 variant=None, precision="fp32", allow_storage_only=False):
    """torch.nn.functional.scaled_dot_product_attention (inference), on the attention core.

    q [B, heads, S_q, d], k and v [B, heads, S_k, d], float32 NumPy arrays or torch tensors.
    attn_mask: bool (True = take part) or additive float, broadcastable to
    [B, heads, S_q, S_k]. key_padding_mask [B, S_k]: 1 = real key, 0 = padding. is_causal:
    key j excluded for query i when j > i + (S_k - S_q), bottom-right aligned as in
    FlashAttention (for S_q = S_k the same as torch). scale: None for 1/sqrt(d). A query whose
    every key is excluded by key_padding_mask, is_causal or a keys-only mask gets zeros.
    Returns [B, heads, S_q, d], a transposed view of [B, S_q, heads, d] memory (as torch's
    eager attention makes it before its transpose(1, 2)). torch tensors go through the
    custom operator attn::scaled_dot_product_attention, so this works in torch.compile.
    precision="bf16" computes QKᵀ and P·V in bf16 (attention_core_bf16: q, k, v and the softmax's
    exponentials rounded to bf16, f32 sums, vdpbf16ps where the CPU has avx512bf16; without it,
    refused unless allow_storage_only, which widens them to f32); the inputs and the output stay
    float32. With no variant named, the widest that has the bf16 core (attn::select_variant).
    torch.bfloat16 q, k and v (a model in bf16) are taken too, in either precision: widened to
    float32 (exact), and the output rounded back to bfloat16.
    """
    _check_core_precision(precision)
    bfloat16 = _is_torch(q) and q.dtype == _torch().bfloat16
    if bfloat16:
        q, k, v = _widened("q", q), _widened("k", k), _widened("v", v)
        out = scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, key_padding_mask=key_padding_mask,
                                           variant=variant, precision=precision,
                                           allow_storage_only=allow_storage_only)
        return out.to(_torch().bfloat16)
    _check_core_inputs(q, k, v)
    _check_no_grad((("q", q), ("k", k), ("v", v), ("attn_mask", attn_mask)))
    if _is_torch(q):
        from . import _torch_ops
        for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
            if mask is not None:
                _check_device(name, mask, "q", q)
        _as_array("attn_mask", attn_mask, "mask" if attn_mask is not None and attn_mask.dtype == _torch().bool
                  else "float32")
        _as_array("key_padding_mask", key_padding_mask, "mask")
        return _torch_ops.scaled_dot_product_attention(q, k, v, attn_mask, key_padding_mask, bool(is_causal),
                                                       None if scale is None else float(scale), variant or "",
                                                       precision, bool(allow_storage_only))
    return _core(q, k, v, attn_mask, key_padding_mask, is_causal, scale, variant, precision, allow_storage_only)


# --- the fused layer ---------------------------------------------------------------------

_WEIGHTS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o", "gamma", "beta")


def _right_padded(mask):
    """Whether every row of a 0/1 mask [B, S] is ones, then zeros."""
    m = mask.astype(np.int8) if isinstance(mask, np.ndarray) else mask.to(_torch().int8)
    return bool((m[:, 1:] <= m[:, :-1]).all())


# The projections' precisions (attn::Precision).
PRECISIONS = ("fp32", "bf16", "int8")


class AttentionLayer:
    """The fused BERT self-attention layer: LayerNorm(x + (softmax(QK^T/sqrt(d) + masks) V) W_o^T + b_o).

    Weights in nn.Linear's convention (w_* [H, H] as [out, in], biases [H]), float32 NumPy
    arrays or torch tensors. The four matrices are prepared here (fp32: in the layout the
    fused layer reads, panels of a vector of outputs on a CPU, transposed on a GPU); the vectors are viewed, not copied. Torch weights changed in place
    (their version moves: load_state_dict, an optimizer step) are prepared again at the next
    call, in the same precision and variant (from_hf keeps the module's own tensors); NumPy
    weights must not change while the layer is used.

    precision="bf16" computes the four projections and the attention core's products (QKᵀ,
    P·V) in bf16 (attn::Precision::bf16): the weight matrices rounded to bf16 once, here (so
    later changes to them are not seen), the inputs of each product rounded as they enter, f32
    sums. It runs on a CPU with avx512bf16, or,
    with allow_storage_only=True, as bf16 storage with f32 arithmetic elsewhere (about the
    AVX2 fp32 layer's speed); without
    probabilities. precision="int8" computes the projections in int8 (attn::Precision::int8):
    the weight matrices quantized once, here, per output feature, the inputs of each projection
    quantized to u8 per token as they enter, i32 sums dequantized in f32; the core's products
    in bf16 as above; on a CPU with avx512vnni, or,
    with allow_storage_only=True, without vpdpbusd elsewhere (the same results: the weights are
    7-bit, [-63, 63], everywhere, so AVX2 sums pairs of products in 16 bits with vpmaddubsw,
    1.5-1.9x fp32's speed there).

    torch.bfloat16 tensors (a model in bf16) are taken too, in every precision: the weights
    widened once, here, to float32 copies (so later changes to them are not seen; with
    precision="bf16" the rounding then changes nothing), and each call's inputs widened, the
    outputs rounded back to bfloat16.
    """

    def __init__(self, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, gamma, beta, *, num_heads, layer_norm_eps=1e-12,
                 causal=False, variant=None, precision="fp32", allow_storage_only=False):
        weights = dict(zip(_WEIGHTS, (w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, gamma, beta)))
        self._parameters = weights  # as given: whether they require grad is checked per call
        weights = {name: _widened(name, w) for name, w in weights.items()}
        for name, w in weights.items():
            _check_device(name, w, "w_q", w_q)
        if _is_torch(w_q):
            weights = {name: w.detach() for name, w in weights.items()}
        if not isinstance(num_heads, int) or isinstance(num_heads, bool):
            raise TypeError(f"num_heads: expected an int, got {_describe(num_heads)}")
        hidden = _shape(w_q)[0] if len(_shape(w_q)) == 2 else -1
        if hidden <= 0 or _shape(w_q) != (hidden, hidden):
            raise ValueError(f"w_q: expected a square [H, H] matrix, got shape {list(_shape(w_q))}")
        self.weights = {name: _contiguous(w) for name, w in weights.items()}
        self.hidden_size, self.num_heads = hidden, num_heads
        self.layer_norm_eps, self.causal = float(layer_norm_eps), bool(causal)
        if precision not in PRECISIONS:
            raise ValueError(f"precision: expected one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
        self.precision = precision
        self._make = lambda: _call({"hidden_size": "w_q", "layer_norm_eps": "layer_norm_eps"}, _attn.Layer, hidden,
                                   num_heads, self.layer_norm_eps, self.causal, self.weights,
                                   _variant_for(variant, self.weights["w_q"], "w_q"), precision,
                                   bool(allow_storage_only))
        self._native, self._versions = self._make(), self._weight_versions()
        self.variant = self._layer.variant["name"]
        self._device = self._layer.variant["device"]
        if _is_torch(w_q):
            from . import _torch_ops
            _torch_ops.remember(self)
        # Padded batches skip their padding through the packed function, where the variant has it.
        packed = "attention_layer_packed" + ("" if precision == "fp32" else "_" + precision)
        self._skips_padding = packed in self._layer.variant["functions"]

    def _weight_versions(self):
        return tuple(w._version for w in self.weights.values()) if _is_torch(self.weights["w_q"]) else None

    @property
    def _layer(self):
        """The native layer, made again from the weights as they are now if torch weights were
        changed in place since it prepared its copy of them."""
        versions = self._weight_versions()
        if versions != self._versions:
            self._native, self._versions = self._make(), versions
        return self._native

    @classmethod
    def from_hf(cls, module, variant=None, precision="fp32", allow_storage_only=False):
        """The fused layer of a transformers BertAttention (or one of its family: RoBERTa,
        MiniLM, ...: a `.self` with query/key/value Linears and an `.output` with dense and
        LayerNorm), sharing the module's parameter tensors."""
        self_attention, output = getattr(module, "self", None), getattr(module, "output", None)
        needed = [(self_attention, "query"), (self_attention, "key"), (self_attention, "value"),
                  (output, "dense"), (output, "LayerNorm")]
        if self_attention is None or output is None or any(not hasattr(m, n) for m, n in needed):
            raise TypeError(f"module: expected a transformers BertAttention (.self.query/key/value, "
                            f".output.dense/LayerNorm), got {_describe(module)}")
        if getattr(module, "is_cross_attention", False):
            raise ValueError("module: expected self-attention, got a cross-attention block")
        s, o = self_attention, output
        return cls(s.query.weight, s.query.bias, s.key.weight, s.key.bias, s.value.weight, s.value.bias,
                   o.dense.weight, o.dense.bias, o.LayerNorm.weight, o.LayerNorm.bias,
                   num_heads=int(s.num_attention_heads), layer_norm_eps=float(o.LayerNorm.eps),
                   causal=bool(getattr(s, "is_causal", False)), variant=variant, precision=precision,
                   allow_storage_only=allow_storage_only)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False, *, cu_seqlens=None, bias=None):
        """hidden_states [B, S, H] -> [B, S, H]; or, with cu_seqlens ([B + 1] int32 offsets of
        packed sequences, FlashAttention's varlen form), packed tokens [T, H] -> [T, H].

        attention_mask [B, S]: 1 = real token, 0 = padding (transformers' attention_mask).
        Right-padded batches on the CPU are computed without their padding, through the
        packed function where the variant has it (without probabilities, and with a bias of
        batch 1 if any): rows at padded positions then come back as zeros; otherwise they
        are computed as any row (and no real token reads them). bias: an additive score bias [B or 1, heads or 1, S, S] (packed:
        [heads or 1, S_max, S_max]). output_attentions: also returns the probabilities,
        [B, heads, S, S] (packed: each sequence's [heads, L, L], concatenated).
        """
        if _is_torch(hidden_states) and hidden_states.dtype == _torch().bfloat16:
            # The float32 call below checks (and widens) the rest; .float() keeps requires_grad.
            out = self.forward(hidden_states.float(), attention_mask, output_attentions, cu_seqlens=cu_seqlens,
                               bias=bias)
            rounded = lambda t: t.to(_torch().bfloat16)  # noqa: E731
            return tuple(map(rounded, out)) if isinstance(out, tuple) else rounded(out)
        x = _as_array("hidden_states", hidden_states)
        _check_no_grad([("hidden_states", x), ("bias", bias), *self._parameters.items()])
        bias = None if bias is None else _widened("bias", bias)
        _check_device("hidden_states", x, "the weights", self.weights["w_q"])
        if bias is not None:
            _check_device("bias", bias, "hidden_states", x)
        if cu_seqlens is not None:
            if attention_mask is not None:
                raise ValueError("attention_mask: expected None with cu_seqlens (packed tokens have no padding)")
            if _is_torch(x) and _is_torch(cu_seqlens) and not output_attentions:
                from . import _torch_ops
                return _torch_ops.attention_layer_packed(self, x, cu_seqlens, bias)
            return self._forward_packed(x, cu_seqlens, bias, output_attentions)
        if attention_mask is not None:
            attention_mask = _as_array("attention_mask", attention_mask, "mask")
            _check_device("attention_mask", attention_mask, "hidden_states", x)
        if _is_torch(x):
            from . import _torch_ops
            return _torch_ops.attention_layer(self, x, attention_mask, bias, bool(output_attentions))
        return self._forward(x, attention_mask, bias, output_attentions)

    __call__ = forward

    _NAMES = {"x": "hidden_states", "y": "hidden_states", "key_padding_mask": "attention_mask",
              "sequence_offsets": "cu_seqlens", "probs": "output_attentions"}

    def _forward(self, x, attention_mask, bias, output_attentions):
        x = _contiguous(x)
        bias = None if bias is None else _contiguous(bias)
        mask = None if attention_mask is None else _mask_bytes(attention_mask)
        y = _empty(x, _shape(x))
        if output_attentions:
            if len(_shape(x)) != 3:
                raise ValueError(f"hidden_states: expected shape [B, S, {self.hidden_size}], got {list(_shape(x))}")
            batch, seq = _shape(x)[:2]
            probs = _empty(x, (batch, self.num_heads, seq, seq))
            _call(self._NAMES, _cuda_call, x, self._layer.forward, x, y, None, mask, bias, probs)
            self._synchronize(x)
            return y, probs
        if (self._skips_padding and mask is not None and len(_shape(mask)) == 2 and not _is_cuda(x)
                and (bias is None or _shape(bias)[0] == 1) and _right_padded(mask)):
            _call(self._NAMES, self._layer.forward_unpadded, x, mask, y, bias)
        else:
            _call(self._NAMES, _cuda_call, x, self._layer.forward, x, y, None, mask, bias, None)
            self._synchronize(x)
        return y

    def _synchronize(self, x):
        if _is_cuda(x):
            self._layer.synchronize()

    def _forward_packed(self, x, cu_seqlens, bias, output_attentions):
        _as_array("cu_seqlens", cu_seqlens, "int32")
        if _is_torch(cu_seqlens):
            cu_seqlens = cu_seqlens.cpu()  # host memory: the runtime reads the offsets to plan the call
        x = _contiguous(x)
        cu_seqlens = _contiguous(cu_seqlens)
        bias = None if bias is None else _contiguous(bias)
        y = _empty(x, _shape(x))
        probs = None
        if output_attentions:  # in host memory, as the runtime writes it (then moved to x's device)
            offsets = np.asarray(cu_seqlens, dtype=np.int64)
            lengths = offsets[1:] - offsets[:-1]
            size = int(self.num_heads * (lengths * lengths).sum())
            probs = _torch().empty(size) if _is_torch(x) else np.empty(size, dtype=np.float32)
        _call(self._NAMES, _cuda_call, x, self._layer.forward_packed, x, cu_seqlens, y, bias, probs)
        self._synchronize(x)
        if output_attentions:
            return y, (probs.to(x.device) if _is_torch(x) else probs)
        return y

    def __repr__(self):
        return (f"attn.AttentionLayer(hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"causal={self.causal}, variant={self.variant!r}, precision={self.precision!r})")
