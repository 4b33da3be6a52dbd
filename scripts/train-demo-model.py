#!/usr/bin/python3
"""Trains the demo's language model: a small Llama-architecture decoder on the license texts
Debian ships in /usr/share/common-licenses (their terms allow copying them), with a byte-level BPE
tokenizer trained on the same text by tests/python/tokenizer_reference.py. Minutes on a CPU with
Debian's python3-torch; the result is a Hugging Face model directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template,
generation_config.json) that warmpool serves as it would any other, and expected.json: the
greedy continuations this script's own PyTorch model gives, which warmpool's engine must repeat
token for token (tests/unit/demo_model_test.cc).

    scripts/train-demo-model.py [OUT_DIR] [--steps N]     (default: demo/license-llama)

The architecture is written here from its definition (RMSNorm, rotary embeddings as Llama's
rotate-half, grouped-query attention, SwiGLU, tied embeddings), not from warmpool's code.
"""

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CORPUS = ["GPL-3", "GPL-2", "LGPL-3", "LGPL-2.1", "Apache-2.0", "Artistic", "BSD", "MPL-2.0", "GFDL-1.3"]
CONFIG = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0)
PROMPTS = ["This License", "You may convey", "the terms and conditions", "Copyright"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content | trim }}\n"
                 "{% elif m.role == 'assistant' %}A: {{ m.content | trim }}{{ eos_token }}\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}A:{% endif %}")


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama(torch.nn.Module):
    def __init__(self, vocab, c):
        super().__init__()
        self.c = c
        h, kv = c["hidden_size"], c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"])
        self.embed = torch.nn.Parameter(torch.randn(vocab, h) * 0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(c["num_hidden_layers"]):
            layer = torch.nn.ParameterDict({
                "input_layernorm": torch.nn.Parameter(torch.ones(h)),
                "q_proj": torch.nn.Parameter(torch.randn(h, h) * 0.02),
                "k_proj": torch.nn.Parameter(torch.randn(kv, h) * 0.02),
                "v_proj": torch.nn.Parameter(torch.randn(kv, h) * 0.02),
                "o_proj": torch.nn.Parameter(torch.randn(h, h) * 0.02 / math.sqrt(2 * c["num_hidden_layers"])),
                "post_attention_layernorm": torch.nn.Parameter(torch.ones(h)),
                "gate_proj": torch.nn.Parameter(torch.randn(c["intermediate_size"], h) * 0.02),
                "up_proj": torch.nn.Parameter(torch.randn(c["intermediate_size"], h) * 0.02),
                "down_proj": torch.nn.Parameter(
                    torch.randn(h, c["intermediate_size"]) * 0.02 / math.sqrt(2 * c["num_hidden_layers"])),
            })
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(torch.ones(h))

    def forward(self, ids):
        c = self.c
        b, t = ids.shape
        heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        d = c["hidden_size"] // heads
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(t, dtype=torch.float32), inv)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed[ids]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for L in self.layers:
            y = rms_norm(x, L["input_layernorm"], c["rms_norm_eps"])
            q = (y @ L["q_proj"].T).view(b, t, heads, d).transpose(1, 2)
            k = (y @ L["k_proj"].T).view(b, t, kv_heads, d).transpose(1, 2)
            v = (y @ L["v_proj"].T).view(b, t, kv_heads, d).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) + mask
            a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + a @ L["o_proj"].T
            y = rms_norm(x, L["post_attention_layernorm"], c["rms_norm_eps"])
            x = x + (F.silu(y @ L["gate_proj"].T) * (y @ L["up_proj"].T)) @ L["down_proj"].T
        return rms_norm(x, self.norm, c["rms_norm_eps"]) @ self.embed.T  # tied embeddings


def encode(tokenizer_path, texts):
    """Token ids of each text, by the reference tokenizer (no special tokens added)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as f:
        json.dump(texts, f)
        f.flush()
        out = subprocess.run([sys.executable, os.path.join(REPO, "tests/python/tokenizer_reference.py"), "encode",
                              tokenizer_path, f.name], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default=os.path.join(REPO, "demo/license-llama"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--merges", type=int, default=700)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(args.out, exist_ok=True)
    texts = [open(f"/usr/share/common-licenses/{name}", encoding="utf-8").read() for name in CORPUS]
    corpus = os.path.join(args.out, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n\n".join(texts))
    tokenizer = os.path.join(args.out, "tokenizer.json")
    subprocess.run([sys.executable, os.path.join(REPO, "tests/python/tokenizer_reference.py"), "train", corpus,
                    "--merges", str(args.merges), "--style", "llama3", "--out", tokenizer], check=True)
    os.remove(corpus)
    t = json.load(open(tokenizer))
    specials = {a["content"]: a["id"] for a in t["added_tokens"]}
    vocab = max(list(t["model"]["vocab"].values()) + list(specials.values())) + 1
    bos, eos = specials["<|begin_of_text|>"], specials["<|end|>"]
    # Prompts begin with <|begin_of_text|>, as every training text does: the tokenizer adds it (a
    # TemplateProcessing post-processor, as Llama 3's tokenizer.json has).
    t["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}},
    }
    json.dump(t, open(tokenizer, "w", encoding="utf-8"), ensure_ascii=False)
    ids = []
    for encoded in encode(tokenizer, texts):
        ids += [bos] + encoded + [eos]
    data = torch.tensor(ids)
    print(f"{len(ids)} tokens of text, vocabulary {vocab}", flush=True)

    model = Llama(vocab, CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    context, batch = 128, 32
    for step in range(args.steps):
        lr = 3e-3 * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(data) - context - 1, (batch,))
        x = torch.stack([data[s:s + context] for s in starts])
        y = torch.stack([data[s + 1:s + context + 1] for s in starts])
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f}", flush=True)

    # The Hugging Face names of a LlamaForCausalLM with tied embeddings, in f32.
    tensors = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    for i, L in enumerate(model.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{name}.weight"] = L[name]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"model.layers.{i}.self_attn.{name}.weight"] = L[name]
        for name in ("gate_proj", "up_proj", "down_proj"):
            tensors[f"model.layers.{i}.mlp.{name}.weight"] = L[name]
    write_safetensors(os.path.join(args.out, "model.safetensors"), {k: v.detach().float() for k, v in tensors.items()})
    config = dict(CONFIG, architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab,
                  tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, torch_dtype="float32",
                  hidden_act="silu", attention_bias=False)
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>", "chat_template": CHAT_TEMPLATE},
              open(os.path.join(args.out, "tokenizer_config.json"), "w"), indent=2)
    json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False},
              open(os.path.join(args.out, "generation_config.json"), "w"), indent=2)

    # Greedy continuations of this very model, for the engine to repeat.
    expected = []
    with torch.no_grad():
        for prompt, encoded in zip(PROMPTS, encode(tokenizer, PROMPTS)):
            sequence = [bos] + encoded
            generated = []
            for _ in range(64):
                logits = model(torch.tensor([sequence]))[0, -1]
                token = int(torch.argmax(logits))
                if token == eos:
                    break
                generated.append(token)
                sequence.append(token)
            expected.append({"prompt": prompt, "tokens": generated})
    json.dump(expected, open(os.path.join(args.out, "expected.json"), "w"), indent=1)
    print(f"wrote {args.out}")


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main()
