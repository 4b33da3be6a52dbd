#!/usr/bin/python3
"""warmpool-bench --generate's PyTorch baseline: the same Llama checkpoint directory decoded by
PyTorch in-process, as a user of Debian's python3-torch would run it (weights in the given dtype,
computed in it, a KV cache, inference mode), so that the engine's tokens/s has a ratio.

    warmpool-bench-torch-llama.py DIR DTYPE THREADS PROMPT TOKENS ROUNDS

Prints one JSON line: {"decode_tokens_per_s": [per round], "prefill_tokens_per_s": [per round]}.
The architecture is written here from its definition (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU), as scripts/train-demo-model.py writes it. Without PyTorch it prints the reason
on stderr and exits 3.
"""

import json
import math
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:
    print(f"PyTorch is not installed ({error}): apt-get install python3-torch", file=sys.stderr)
    sys.exit(3)

DTYPES = {"F32": (np.float32, None), "F16": (np.float16, None), "BF16": (np.int16, torch.bfloat16)}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        numpy_type, view = DTYPES[info["dtype"]]
        t = torch.from_numpy(np.frombuffer(data[begin:end], dtype=numpy_type).copy()).reshape(info["shape"])
        tensors[name] = t.view(view) if view is not None else t
    return tensors


def main():
    directory, dtype, threads, prompt, tokens, rounds = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    torch.set_num_threads(threads)
    c = json.load(open(f"{directory}/config.json"))
    kind = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    w = {k: v.to(kind) for k, v in read_safetensors(f"{directory}/model.safetensors").items()}
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // heads
    eps, layers = c["rms_norm_eps"], c["num_hidden_layers"]
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def norm(x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(kind) * weight

    def rope(x, positions):
        angles = torch.outer(positions.float(), inv)
        cos, sin = torch.cat((angles, angles), -1).cos().to(kind), torch.cat((angles, angles), -1).sin().to(kind)
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    def forward(ids, start, cache):
        t = len(ids)
        positions = torch.arange(start, start + t)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        for i in range(layers):
            p = f"model.layers.{i}."
            y = norm(x, w[p + "input_layernorm.weight"])
            q = (y @ w[p + "self_attn.q_proj.weight"].T).view(t, heads, d).transpose(0, 1)
            k = (y @ w[p + "self_attn.k_proj.weight"].T).view(t, kv_heads, d).transpose(0, 1)
            v = (y @ w[p + "self_attn.v_proj.weight"].T).view(t, kv_heads, d).transpose(0, 1)
            q, k = rope(q, positions), rope(k, positions)
            keys, values = cache[i]
            keys[:, start:start + t], values[:, start:start + t] = k, v
            k_all = keys[:, :start + t].repeat_interleave(heads // kv_heads, 0)
            v_all = values[:, :start + t].repeat_interleave(heads // kv_heads, 0)
            scores = (q @ k_all.transpose(-1, -2)).float() / math.sqrt(d)
            scores += torch.full((t, start + t), float("-inf")).triu(start + 1)
            a = (scores.softmax(-1).to(kind) @ v_all).transpose(0, 1).reshape(t, heads * d)
            x = x + a @ w[p + "self_attn.o_proj.weight"].T
            y = norm(x, w[p + "post_attention_layernorm.weight"])
            gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return norm(x[-1:], w["model.norm.weight"]) @ lm_head.T

    decode, prefill = [], []
    with torch.inference_mode():
        for r in range(rounds):
            cache = [(torch.zeros(kv_heads, prompt + tokens + 1, d, dtype=kind),
                      torch.zeros(kv_heads, prompt + tokens + 1, d, dtype=kind)) for _ in range(layers)]
            ids = [(i * 7919 + r) % c["vocab_size"] for i in range(prompt)]
            start = time.perf_counter()
            logits = forward(ids, 0, cache)
            prefill.append(prompt / (time.perf_counter() - start))
            start = time.perf_counter()
            for step in range(tokens):
                logits = forward([int(logits.argmax())], prompt + step, cache)
            decode.append(tokens / (time.perf_counter() - start))
    print(json.dumps({"decode_tokens_per_s": decode, "prefill_tokens_per_s": prefill}))


if __name__ == "__main__":
    main()
