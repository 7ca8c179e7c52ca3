#!/usr/bin/env python3
"""The Python peers of the comparison (bench/compare.py times them interleaved with
attn_bench's cases), on the problems attn_bench lists, with the same sequence lengths.

CPU: PyTorch (eager projections + scaled_dot_product_attention + LayerNorm) and ONNX
Runtime (its fused contrib Attention operator + output projection + LayerNorm); PyTorch's
layer also in bf16 (pytorch_bf16), and both with their projections dynamically quantized
to int8 by the library's own quantize_dynamic (pytorch_int8, onnxruntime_int8).

CUDA, timed with torch.cuda.synchronize() inside the timed region as attn_bench does for
the CUDA variants: PyTorch eager fp32 the way Hugging Face's BertSelfAttention computes
it (matmul, scale, additive mask, softmax, matmul), PyTorch fp32 with
scaled_dot_product_attention, the same in bf16 (for context: not held to the float32
accuracy check), and a cuBLAS sgemm roofline (TF32 off) of the layer's four projections.

Each peer's output is checked against numpy_layer, the layer in float64 from DESIGN.md's
formulas (problems with reference_checked only), before it is timed.
"""
import pathlib
import tempfile
import warnings

import numpy as np


def layer_flops(p):
    b, sq, sk, h = p["batch"], p["s_q"], p["s_k"], p["hidden"]
    return 2 * b * (sq + 2 * sk) * h * h + 2 * 2 * b * sq * sk * h + 2 * b * sq * h * h


def make_inputs(p, seed=1234):
    rng = np.random.default_rng(seed)
    h = p["hidden"]
    w = 1.0 / np.sqrt(h)
    f32 = np.float32
    data = {
        "x": rng.uniform(-1, 1, (p["batch"], p["s_q"], h)).astype(f32),
        "gamma": rng.uniform(0.9, 1.1, h).astype(f32),
    }
    for name in ("w_q", "w_k", "w_v", "w_o"):
        data[name] = rng.uniform(-w, w, (h, h)).astype(f32)
    for name in ("b_q", "b_k", "b_v", "b_o", "beta"):
        data[name] = rng.uniform(-0.1, 0.1, h).astype(f32)
    mask = np.zeros((p["batch"], p["s_k"]), dtype=bool)
    for b, real in enumerate(p["lengths"]):
        mask[b, :real] = True
    data["mask"] = mask
    return data


def keep_matrix(p, mask):
    """[B, 1, S_q, S_k] bool: key padding and (bottom-right aligned) causal masks."""
    keep = mask[:, None, None, :].repeat(p["s_q"], axis=2)
    if p["causal"]:
        i = np.arange(p["s_q"])[:, None]
        j = np.arange(p["s_k"])[None, :]
        keep = keep & ~(j > i + (p["s_k"] - p["s_q"]))[None, None]
    return keep


def numpy_core(p, q, k, v, mask):
    """The attention core in float64 from DESIGN.md's formulas: [B, S_q, H] from q [B, S_q, H]
    and k, v [B, S_k, H] (heads interleaved), the key padding and causal masks applied."""
    bsz, sq, hid = q.shape
    hd = hid // p["heads"]

    def split(t):
        return t.astype(np.float64).reshape(bsz, -1, p["heads"], hd).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    keep = keep_matrix(p, mask)
    scores = np.where(keep, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    e = np.where(keep, np.exp(scores - np.where(np.isfinite(row_max), row_max, 0)), 0.0)
    s = e.sum(-1, keepdims=True)
    probs = np.where(s > 0, e / np.where(s > 0, s, 1), 0.0)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(bsz, sq, hid)


def numpy_layer(p, d, eps=1e-12):
    """The layer in float64 from DESIGN.md's formulas: the peers' correctness check."""
    x = d["x"].astype(np.float64)
    hid = x.shape[2]

    def lin(t, w, b):
        return t @ d[w].astype(np.float64).T + d[b].astype(np.float64)

    ctx = numpy_core(p, lin(x, "w_q", "b_q"), lin(x, "w_k", "b_k"), lin(x, "w_v", "b_v"), d["mask"])
    dense = x + lin(ctx, "w_o", "b_o")
    mean = dense.mean(-1, keepdims=True)
    var = ((dense - mean) ** 2).mean(-1, keepdims=True)
    return d["gamma"] * (dense - mean) / np.sqrt(var + eps) + d["beta"]


# The int8 peers' check. With 8-bit activations (quantized per tensor from each call's range;
# 2/255 a step for x in [-1, 1]) and 8-bit weights, the layer's y (LayerNorm's output, |y| up
# to ~3) is off the float64 reference by at most, on the reference-checked problems, measured
# (PyTorch 2.15.0, ONNX Runtime 1.31.1, make_inputs' seed): pytorch_int8 0.0036 (B=1 S=128),
# 0.0033 (S=384), 0.0065 (B=8 padded and packed), 0.0036 (MiniLM), 0.0222 (causal);
# onnxruntime_int8 0.0024, 0.0023, 0.0034, 0.0021, 0.0112. Causal is the worst: its first
# queries see one to a few keys, so a context row is a quantized row of V, not an average of
# many. 0.05 is 2.25x the worst of these, room for another library version's rounding, and
# 2.4x below the smallest error of a wrong layer tried (the padding mask ignored at B=8 S=128:
# 0.12; the causal mask ignored: 1.1).
INT8_TOLERANCE = 0.05


def cpu_has_vnni():
    """Whether this CPU multiplies u8 by s8 without 16-bit saturation (AVX-512 VNNI or AVX-VNNI:
    vpdpbusd), from /proc/cpuinfo's flags; False where there is none to read."""
    try:
        flags = set(pathlib.Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_vnni", "avx_vnni"})


class Peer:
    function = "attention_layer"  # what it computes, as attn_bench names its cases' functions
    checked = True  # held to the float64 reference (expected) before it is timed
    tolerance = 1e-4  # the largest error against it that passes
    roofline = False  # times the layer's GEMMs only

    def gflop(self, p):
        return layer_flops(p) * 1e-9

    @staticmethod
    def expected(p, d):
        return numpy_layer(p, d)

    @staticmethod
    def output(y):
        """What prepare()'s run() returns, as a NumPy array."""
        return y

    def activate(self):
        """Before each of its runs: makes its thread count the process's where its library has
        one pool per process (PyTorch), so that peers of several counts share one comparison."""


class PyTorchPeer(Peer):
    """The layer as a PyTorch user writes it: nn.Linear's F.linear, SDPA, LayerNorm. With bf16,
    the whole layer in torch.bfloat16 (weights, activations and y), as a user who casts the
    model with .to(torch.bfloat16) runs it: checked against the float64 reference at 0.05,
    since y itself is rounded to bf16 (2^-8 of |y| <= ~4) on top of every product's input.
    With int8, the four projections as nn.Linear modules passed through
    torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8), as a user quantizes a model
    for the CPU (deprecated in favour of torchao, still in PyTorch; the x86 engine, FBGEMM):
    weights int8 per tensor, symmetric; activations uint8 per tensor from each call's range,
    in 7 bits (reduce_range, against vpmaddubsw's saturation); SDPA, the residual and
    LayerNorm in fp32. Checked at INT8_TOLERANCE (0.05; why, with the errors measured,
    beside it)."""

    def __init__(self, threads, precision="fp32"):
        import torch

        self.torch, self.precision, self.threads = torch, precision, threads
        self.name = "pytorch" + ("" if precision == "fp32" else "_" + precision)
        self.tolerance = {"fp32": Peer.tolerance, "bf16": 0.05, "int8": INT8_TOLERANCE}[precision]
        self.version = torch.__version__

    @staticmethod
    def output(y):
        return y.float().numpy()

    def projections(self, t, hid):
        """{"q", "k", "v", "o"}: x -> x W^T + b."""
        torch, F = self.torch, self.torch.nn.functional
        if self.precision != "int8":
            return {n: lambda x, w=t["w_" + n], b=t["b_" + n]: F.linear(x, w, b) for n in "qkvo"}
        linears = torch.nn.ModuleDict({n: torch.nn.Linear(hid, hid) for n in "qkvo"})
        with torch.no_grad():
            for n, linear in linears.items():
                linear.weight.copy_(t["w_" + n])
                linear.bias.copy_(t["b_" + n])
        with warnings.catch_warnings():  # its deprecation notices
            warnings.simplefilter("ignore")
            return dict(torch.ao.quantization.quantize_dynamic(linears, {torch.nn.Linear}, dtype=torch.qint8).items())

    def prepare(self, p, d):
        torch, F = self.torch, self.torch.nn.functional
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        t = {k: torch.from_numpy(v) for k, v in d.items()}
        t = {k: v.to(dtype) if v.dtype == torch.float32 else v for k, v in t.items()}
        bsz, sq, hid = d["x"].shape
        heads, hd = p["heads"], hid // p["heads"]
        linear = self.projections(t, hid)
        padded = not d["mask"].all()
        attn_mask = None
        is_causal = False
        if padded:
            attn_mask = torch.from_numpy(keep_matrix(p, d["mask"]))
        elif p["causal"]:
            is_causal = True

        def run():
            with torch.inference_mode():
                x = t["x"]

                def heads_of(n):
                    return linear[n](x).view(bsz, -1, heads, hd).transpose(1, 2)

                q, k, v = heads_of("q"), heads_of("k"), heads_of("v")
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
                ctx = ctx.transpose(1, 2).reshape(bsz, sq, hid)
                return F.layer_norm(x + linear["o"](ctx), (hid,), t["gamma"], t["beta"], 1e-12)

        return run

    def activate(self):
        self.torch.set_num_threads(self.threads)


class OnnxRuntimePeer(Peer):
    name = "onnxruntime"

    def __init__(self, threads):
        import onnxruntime as ort

        self.ort = ort
        self.threads = threads
        self.version = ort.__version__

    def model(self, p, d):
        """The layer's ONNX graph (a ModelProto), its weights as initializers."""
        from onnx import TensorProto, helper, numpy_helper

        hid = p["hidden"]
        w_qkv = np.concatenate([d["w_q"].T, d["w_k"].T, d["w_v"].T], axis=1)  # [H, 3H]
        b_qkv = np.concatenate([d["b_q"], d["b_k"], d["b_v"]])
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(w_qkv), "w_qkv"),
            numpy_helper.from_array(b_qkv, "b_qkv"),
            numpy_helper.from_array(np.ascontiguousarray(d["w_o"].T), "w_o_t"),
            numpy_helper.from_array(d["b_o"], "b_o"),
            numpy_helper.from_array(d["gamma"], "gamma"),
            numpy_helper.from_array(d["beta"], "beta"),
        ]
        nodes = [
            helper.make_node("Attention", ["x", "w_qkv", "b_qkv", "mask"], ["ctx"], domain="com.microsoft",
                             num_heads=p["heads"], unidirectional=1 if p["causal"] else 0),
            helper.make_node("MatMul", ["ctx", "w_o_t"], ["proj"]),
            helper.make_node("Add", ["proj", "b_o"], ["proj_b"]),
            helper.make_node("Add", ["proj_b", "x"], ["dense"]),
            helper.make_node("LayerNormalization", ["dense", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12),
        ]
        shape = [p["batch"], p["s_q"], hid]
        graph = helper.make_graph(
            nodes, "bert_self_attention",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
             helper.make_tensor_value_info("mask", TensorProto.INT32, [p["batch"], p["s_k"]])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits,
            # The contrib operator's output type, which onnx's shape inference cannot give
            # (onnxruntime.quantization needs it to quantize the MatMul that reads it).
            value_info=[helper.make_tensor_value_info("ctx", TensorProto.FLOAT, shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 10  # onnx writes a newer IR than this onnxruntime reads
        return model

    def prepare(self, p, d):
        options = self.ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = self.ort.InferenceSession(self.model(p, d).SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        feeds = {"x": d["x"], "mask": d["mask"].astype(np.int32)}
        return lambda: session.run(["y"], feeds)[0]


class OnnxRuntimeInt8Peer(OnnxRuntimePeer):
    """OnnxRuntimePeer's graph through onnxruntime.quantization.quantize_dynamic, as an ONNX
    Runtime user quantizes a transformer for the CPU, run with the same session options: the
    Attention node becomes QAttention and the output projection's MatMul becomes
    DynamicQuantizeLinear + MatMulInteger, activations uint8 from each call's range (per
    tensor), the softmax, residual and LayerNorm in fp32. Weights QInt8, symmetric in [-127,
    127] per tensor (per_channel off: the quantizer's default): U8S8 products, ONNX Runtime's
    default and what it recommends on x86-64. With VNNI (vpdpbusd, as on a Zen 4 or a Xeon
    since Cascade Lake) U8S8 cannot overflow, and reduce_range stays off (the default);
    without VNNI its vpmaddubsw can saturate a pair's 16-bit sum, which ONNX Runtime's
    documentation answers with reduce_range (7-bit weights) where accuracy drops, as it does
    there: on an AVX2 Zen 1 (2026-11-27) the default quantization was 0.116 off the float64
    reference at MiniLM B=1 S=128, with reduce_range 0.0031. So the peer quantizes with
    reduce_range on a CPU without VNNI (its version says so). Checked at INT8_TOLERANCE (0.05;
    why, with the errors measured, beside it)."""

    name = "onnxruntime_int8"
    tolerance = INT8_TOLERANCE

    def __init__(self, threads):
        super().__init__(threads)
        self.reduce_range = not cpu_has_vnni()
        if self.reduce_range:
            self.version += " (reduce_range: no VNNI on this CPU)"

    def model(self, p, d):
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with tempfile.TemporaryDirectory() as folder:  # quantize_dynamic writes its model to a file
            int8 = pathlib.Path(folder, "int8.onnx")
            quantize_dynamic(super().model(p, d), int8, weight_type=QuantType.QInt8, reduce_range=self.reduce_range)
            return onnx.load(int8)


class PyTorchCudaPeer(Peer):
    """The layer on a CUDA device: `kind` is eager (BertSelfAttention's arithmetic),
    sdpa, sdpa_bf16, or cublas_roofline (the four projection GEMMs alone)."""

    def __init__(self, kind):
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no CUDA device for PyTorch")
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: no TF32 tensor cores
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.kind = torch, kind
        self.name = "pytorch_" + kind if kind != "cublas_roofline" else kind
        self.version = f"{torch.__version__} on {torch.cuda.get_device_name()}"
        self.checked = kind in ("eager", "sdpa")  # bf16 is for context; the roofline computes no layer
        self.roofline = kind == "cublas_roofline"

    def gflop(self, p):
        if self.roofline:  # the four projections only
            return 2 * 4 * p["batch"] * p["s_q"] * p["hidden"] ** 2 * 1e-9
        return super().gflop(p)

    def prepare(self, p, d):
        torch, F = self.torch, self.torch.nn.functional
        dtype = torch.bfloat16 if self.kind == "sdpa_bf16" else torch.float32
        t = {k: torch.from_numpy(v).cuda() for k, v in d.items()}
        for k in t:
            if t[k].dtype == torch.float32:
                t[k] = t[k].to(dtype)
        bsz, sq, hid = d["x"].shape
        heads, hd = p["heads"], hid // p["heads"]
        keep = torch.from_numpy(keep_matrix(p, d["mask"])).cuda()
        additive = torch.zeros(keep.shape, device="cuda", dtype=dtype).masked_fill(~keep, float("-inf"))

        def layer():
            x = t["x"]
            if self.kind == "cublas_roofline":
                for w in ("w_q", "w_k", "w_v", "w_o"):
                    torch.mm(x.view(-1, hid), t[w].t())
                return x

            def heads_of(w, b):
                return F.linear(x, t[w], t[b]).view(bsz, -1, heads, hd).transpose(1, 2)

            q, k, v = heads_of("w_q", "b_q"), heads_of("w_k", "b_k"), heads_of("w_v", "b_v")
            if self.kind == "eager":
                scores = torch.matmul(q, k.transpose(-1, -2)) / hd ** 0.5 + additive
                probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: zeros
                ctx = torch.matmul(probs, v)
            else:
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).nan_to_num(0.0)
            ctx = ctx.transpose(1, 2).reshape(bsz, sq, hid)
            return F.layer_norm(x + F.linear(ctx, t["w_o"], t["b_o"]), (hid,), t["gamma"], t["beta"], 1e-12)

        def run():
            with torch.inference_mode():
                y = layer()
                torch.cuda.synchronize()
                return y

        return run

    @staticmethod
    def output(y):
        return y.float().cpu().numpy()


class SdpaCorePeer(Peer):
    """The attention core alone (attn_bench's attention_core cases: q = k = v = x, the key
    padding and causal masks): torch.nn.functional.scaled_dot_product_attention on the head
    views of [B, S, H], its output back to [B, S, H]. On `device` "cuda" in fp32 (TF32 off;
    PyTorch may still pick a 3xTF32 tensor-core kernel on sm80+) or, with bf16, for context."""

    function = "attention_core"

    def __init__(self, device, threads=None, bf16=False):
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise ImportError("no CUDA device for PyTorch")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.device, self.bf16, self.threads = torch, device, bf16, threads
        self.name = "pytorch_sdpa" + ("_bf16" if bf16 else "")
        self.checked = not bf16
        self.version = torch.__version__ + (f" on {torch.cuda.get_device_name()}" if device == "cuda" else "")

    def gflop(self, p):
        return 2 * 2 * p["batch"] * p["s_q"] * p["s_k"] * p["hidden"] * 1e-9

    @staticmethod
    def expected(p, d):
        return numpy_core(p, d["x"], d["x"], d["x"], d["mask"])

    def prepare(self, p, d):
        torch, F = self.torch, self.torch.nn.functional
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        x = torch.from_numpy(d["x"]).to(self.device, dtype)
        bsz, sq, hid = d["x"].shape
        heads = x.view(bsz, sq, p["heads"], hid // p["heads"]).transpose(1, 2)
        # As PyTorchPeer: the keep matrix where keys are padded (causal within it), else is_causal
        # (S_q = S_k in every problem, where SDPA's top-left diagonal is DESIGN.md's bottom-right one).
        padded = not d["mask"].all()
        keep = torch.from_numpy(keep_matrix(p, d["mask"])).to(self.device) if padded else None
        causal = p["causal"] and not padded

        def run():
            with torch.inference_mode():
                ctx = F.scaled_dot_product_attention(heads, heads, heads, attn_mask=keep, is_causal=causal)
                ctx = ctx.nan_to_num(0.0).transpose(1, 2).reshape(bsz, sq, hid)
                if self.device == "cuda":
                    torch.cuda.synchronize()
                return ctx

        return run

    @staticmethod
    def output(y):
        return y.float().cpu().numpy()

    def activate(self):
        if self.threads:
            self.torch.set_num_threads(self.threads)


def cpu_peers(threads):
    return [lambda precision=precision: PyTorchPeer(threads, precision) for precision in ("fp32", "bf16", "int8")] + \
        [lambda: OnnxRuntimePeer(threads), lambda: OnnxRuntimeInt8Peer(threads), lambda: SdpaCorePeer("cpu", threads),
         lambda: SdpaCorePeer("cpu", threads, bf16=True)]


def cuda_peers():
    return [lambda kind=kind: PyTorchCudaPeer(kind) for kind in ("eager", "sdpa", "sdpa_bf16", "cublas_roofline")] + \
        [lambda: SdpaCorePeer("cuda"), lambda: SdpaCorePeer("cuda", bf16=True)]
