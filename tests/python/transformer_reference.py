#!/usr/bin/python3
"""An independent numpy reference for the transformer engine, written from the architectures'
definitions (Hugging Face's modeling_llama / modeling_mistral / modeling_qwen2 / modeling_qwen3):
it reads a checkpoint directory (config.json, model.safetensors or shards with
model.safetensors.index.json) and computes, in float64 over the whole sequence at once, the logits
of every position, a greedy continuation, or the sequence's embedding (its last token's final
state at unit length).

  transformer_reference.py DIR --tokens 1,2,3 --out logits.f64      # [tokens x vocab] float64
  transformer_reference.py DIR --tokens 1,2,3 --greedy 8            # prints the 8 tokens chosen
  transformer_reference.py DIR --tokens 1,2,3 --embedding e.f64     # [hidden] float64
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def _read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    data = raw[8 + length :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_DTYPES[entry["dtype"]])
        if entry["dtype"] == "BF16":  # the upper half of an f32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array.astype(np.float64).reshape(entry["shape"])
    return tensors


def load(directory):
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(_read_safetensors(os.path.join(directory, name)))
    return config, weights


def _inv_freq(config, head_dim):
    inv = 1.0 / (config.get("rope_theta", 10000.0) ** (np.arange(0, head_dim, 2) / head_dim))
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"rope scaling {kind}")
    return inv


def _rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rotate(x, cos, sin):
    """x: [seq, heads, dim]; each head's two halves are the coordinates rotated (rotate_half)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def hidden_states(config, w, tokens):
    """[len(tokens) x hidden] states after the final norm, of a sequence starting at position 0."""
    model_type = config["model_type"]
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    eps = config.get("rms_norm_eps", 1e-6)
    window = config.get("sliding_window") if model_type == "mistral" else None
    n = len(tokens)

    positions = np.arange(n, dtype=np.float64)
    angles = positions[:, None] * _inv_freq(config, head_dim)[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    mask = np.where(allowed, 0.0, -np.inf)

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        bias = w.get(name + ".bias")
        return y if bias is None else y + bias

    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = linear(h, p + "self_attn.q_proj").reshape(n, heads, head_dim)
        k = linear(h, p + "self_attn.k_proj").reshape(n, kv_heads, head_dim)
        v = linear(h, p + "self_attn.v_proj").reshape(n, kv_heads, head_dim)
        if model_type == "qwen3":
            q = _rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k = np.repeat(k, heads // kv_heads, axis=1)  # each key/value head serves a group of heads
        v = np.repeat(v, heads // kv_heads, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim) + mask[None]
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", scores, v).reshape(n, heads * head_dim)
        x = x + linear(attended, p + "self_attn.o_proj")
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = linear(h, p + "mlp.gate_proj")
        x = x + linear(gate / (1 + np.exp(-gate)) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    return _rms_norm(x, w["model.norm.weight"], eps)


def logits(config, w, tokens):
    """[len(tokens) x vocab] logits of a sequence starting at position 0."""
    head = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    return hidden_states(config, w, tokens) @ head.T


def embedding(config, w, tokens):
    """The sequence's embedding: its last token's final state, scaled to unit length (last-token
    pooling)."""
    last = hidden_states(config, w, tokens)[-1]
    norm = np.sqrt(np.sum(last * last))
    return last / norm if norm > 0 else last


def greedy(config, w, tokens, count):
    tokens = list(tokens)
    chosen = []
    for _ in range(count):
        chosen.append(int(np.argmax(logits(config, w, tokens)[-1])))
        tokens.append(chosen[-1])
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", help="write the logits here as little-endian float64")
    parser.add_argument("--greedy", type=int, default=0, help="print this many greedily chosen tokens")
    parser.add_argument("--embedding", help="write the embedding here as little-endian float64")
    args = parser.parse_args()
    config, weights = load(args.directory)
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.out:
        logits(config, weights, tokens).astype("<f8").tofile(args.out)
    if args.embedding:
        embedding(config, weights, tokens).astype("<f8").tofile(args.embedding)
    if args.greedy:
        print(",".join(str(t) for t in greedy(config, weights, tokens, args.greedy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
