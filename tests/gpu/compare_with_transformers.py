#!/usr/bin/env python3
"""The transformer engine against Hugging Face on the GPU machine (scripts/gpu-check.sh).

For random-initialised checkpoints of each architecture (warmpool-mkmodel --arch) and the demo
model: the last token's logits after a prompt from warmpool on the CPU and on the GPU
(warmpool-transformer-probe) against `transformers` building the same architecture from the same
config.json and weights, in float32 with eager attention; greedy tokens against greedy decoding by
the definition (argmax of a full recomputation each step). And the demo tokenizer's encodings
against `tokenizers` loading the same tokenizer.json, on fixed and random texts.

Prints one JSON object (the last line); exit status 1 when anything differs beyond its tolerance.
Tolerances are relative to the largest reference logit: 1e-4 on f32 weights; on bf16 weights, whose
products narrow a prompt's activations to bf16, 1e-2 for the CPU and 6e-2 for the GPU. Greedy tokens may part only at a near tie: where they first differ, the
token warmpool chose must be within the tolerance of the best logit transformers computes for
warmpool's own prefix. An architecture this transformers does not know is reported as skipped;
without torch and transformers at all, the whole comparison is (exit status 0).
"""
import argparse
import json
import os
import random
import subprocess
import sys

CASES = [
    # name, mkmodel options (over SHAPE's), dtype
    ("llama-f32", {"--arch": "llama"}, "f32"),
    ("llama3-rope-f32", {"--arch": "llama", "--rope-scaling": "llama3:8", "--context": "131072"}, "f32"),
    ("llama-gqa-tied-f32", {"--arch": "llama", "--kv-heads": "1", "--tie-embeddings": None}, "f32"),
    ("qwen2-f32", {"--arch": "qwen2"}, "f32"),
    ("qwen3-f32", {"--arch": "qwen3"}, "f32"),
    ("mistral-window-f32", {"--arch": "mistral", "--sliding-window": "16"}, "f32"),
    ("llama-bf16", {"--arch": "llama"}, "bf16"),
    ("qwen2-bf16", {"--arch": "qwen2"}, "bf16"),
]
SHAPE = {"--vocab": "1024", "--hidden": "256", "--intermediate": "512", "--num-layers": "2", "--heads": "8",
         "--kv-heads": "2"}


def mkmodel_arguments(options):
    """Each option once (mkmodel takes no repeats), a case's over the shape's; None: a flag."""
    merged = {**SHAPE, **options}
    return [part for key, value in merged.items() for part in ([key] if value is None else [key, value])]


class Unknown(Exception):
    """transformers does not know the architecture: the case is skipped, not failed."""
TEXTS = ["", "Hello world", "  leading and trailing  ", "tabs\tand\nnewlines\n\n", "numbers 1234567 3.14159",
         "caf\u00e9 na\u00efve \u00fcber", "\u4e2d\u6587\u5b57\u7b26", "emoji \U0001F600\U0001F680 done",
         "<|begin_of_text|>special in text<|end|>", "don't won't it's", "a" * 300,
         "This program is free software: you can redistribute it and/or modify it"]


def probe(args, *argv):
    run = subprocess.run([args.probe, *argv], capture_output=True, text=True, timeout=120)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def worst(got, want):
    scale = max(1.0, max(abs(w) for w in want))
    return max(abs(g - w) for g, w in zip(got, want)) / scale


def load_hf(model_dir):
    import torch
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    except (KeyError, ValueError) as e:
        if "does not recognize this architecture" in str(e) or isinstance(e, KeyError):
            raise Unknown(f"{type(e).__name__}: {e}"[:300]) from None
        raise
    return model.to("cuda").eval()


def hf_last_logits(model, tokens):
    import torch
    with torch.no_grad():
        return model(torch.tensor([tokens], device="cuda")).logits[0, -1].float().cpu().tolist()


def hf_greedy(model, tokens, count):
    """Greedy by the definition: the argmax of a full recomputation at each step."""
    sequence = list(tokens)
    for _ in range(count):
        step = hf_last_logits(model, sequence)
        sequence.append(max(range(len(step)), key=step.__getitem__))
    return sequence[len(tokens):]


def greedy_agrees(model, prompt, ours, theirs, tolerance):
    """Equal, or parted at a near tie: warmpool's token within tolerance of the best logit that
    transformers computes for warmpool's own prefix."""
    if ours == theirs:
        return True
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if k >= len(ours):
        return False
    logits = hf_last_logits(model, list(prompt) + ours[:k])
    scale = max(1.0, max(abs(v) for v in logits))
    return max(logits) - logits[ours[k]] <= tolerance * scale


def compare_model(args, name, model_dir, dtype, vocab):
    rng = random.Random(name)
    tokens = [rng.randrange(vocab) for _ in range(48)]
    joined = ",".join(map(str, tokens))
    result = {}
    try:
        model = load_hf(model_dir)
    except Unknown as e:
        return {"skipped": f"this transformers does not know the architecture: {e}"}, True
    ref_logits = hf_last_logits(model, tokens)
    ref_greedy = hf_greedy(model, tokens, args.greedy)
    cpu = probe(args, "logits", model_dir, "--tokens", joined, "--device", "cpu", "--greedy", str(args.greedy))
    gpu = probe(args, "logits", model_dir, "--tokens", joined, "--device", "gpu", "--greedy", str(args.greedy))
    cpu_tolerance = 1e-4 if dtype == "f32" else 1e-2
    gpu_tolerance = 1e-4 if dtype == "f32" else 6e-2
    result["cpu_vs_transformers"] = worst(cpu["logits"], ref_logits)
    result["gpu_vs_transformers"] = worst(gpu["logits"], ref_logits)
    result["gpu_vs_cpu"] = worst(gpu["logits"], cpu["logits"])
    result["gpu_device"] = gpu["device"]
    ok = result["cpu_vs_transformers"] <= cpu_tolerance and result["gpu_vs_transformers"] <= gpu_tolerance
    if dtype == "f32":
        result["greedy_cpu_equal"] = cpu["greedy"] == ref_greedy
        result["greedy_gpu_equal"] = gpu["greedy"] == ref_greedy
        result["greedy_cpu_agrees"] = greedy_agrees(model, tokens, cpu["greedy"], ref_greedy, 1e-4)
        result["greedy_gpu_agrees"] = greedy_agrees(model, tokens, gpu["greedy"], ref_greedy, 1e-4)
        ok = ok and result["greedy_cpu_agrees"] and result["greedy_gpu_agrees"]
    result["passed"] = ok
    return result, ok


def compare_tokenizer(args):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(args.demo, "tokenizer.json"))
    rng = random.Random(1)
    alphabet = ("abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .,;:!?'\"-\t\n\u00e9\u00fc\u00df\u4e2d\u6587"
                "\U0001F600\u0301\u200d")
    texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80))) for _ in range(300)]
    path = os.path.join(args.work, "texts.jsonl")
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    ours = probe(args, "encode", args.demo, "--texts", path)
    mismatches = []
    for i, t in enumerate(texts):
        plain = tokenizer.encode(t, add_special_tokens=False).ids
        special = tokenizer.encode(t, add_special_tokens=True).ids
        if plain != ours["ids"][i] or special != ours["ids_with_special_tokens"][i]:
            mismatches.append({"text": t, "ours": ours["ids"][i], "tokenizers": plain})
    return {"texts": len(texts), "mismatches": len(mismatches), "first": mismatches[:3]}, not mismatches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", required=True)
    parser.add_argument("--mkmodel", required=True)
    parser.add_argument("--demo", required=True, help="the demo model's directory")
    parser.add_argument("--work", required=True, help="a directory for the checkpoints")
    parser.add_argument("--greedy", type=int, default=32)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    summary = {"models": {}}
    passed = True
    try:
        import torch
        import transformers
        summary["transformers"] = transformers.__version__
        summary["torch"] = torch.__version__
    except ImportError as e:
        print(json.dumps({"passed": True, "skipped": f"no torch and transformers here: {e}"}))
        return 0
    for name, options, dtype in CASES:
        model_dir = os.path.join(args.work, name)
        try:
            subprocess.run([args.mkmodel, model_dir, *mkmodel_arguments(options), "--dtype", dtype, "--seed", "3"],
                           check=True, capture_output=True, text=True)
            result, ok = compare_model(args, name, model_dir, dtype, 1024)
        except subprocess.CalledProcessError as e:
            result, ok = {"error": f"warmpool-mkmodel failed: {e.stderr}"[:500]}, False
        except Exception as e:
            result, ok = {"error": f"{type(e).__name__}: {e}"[:500]}, False
        summary["models"][name] = result
        passed = passed and ok
    with open(os.path.join(args.demo, "config.json")) as f:
        demo_vocab = json.load(f)["vocab_size"]
    try:
        summary["models"]["demo"], ok = compare_model(args, "demo", args.demo, "f32", demo_vocab)
    except Exception as e:
        summary["models"]["demo"], ok = {"error": f"{type(e).__name__}: {e}"[:500]}, False
    passed = passed and ok
    try:
        summary["tokenizer"], ok = compare_tokenizer(args)
    except Exception as e:
        summary["tokenizer"], ok = {"error": f"{type(e).__name__}: {e}"[:500]}, False
    passed = passed and ok
    summary["passed"] = passed
    print(json.dumps(summary))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
