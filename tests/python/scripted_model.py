"""A Llama checkpoint whose greedy answer is a script: after any prompt that ends as a chat's
generation prompt does, it writes the given pieces in order, then its end token. Deterministic
output from a real checkpoint, through the real tokenizer, template and engine, for tests of what
is done with a model's text (tool calls read back out of it, say).

How: every layer's output projections are zero, so each position's final state is its own token's
embedding; the embeddings of the script's tokens are orthonormal, and the output head maps each
one to the token that follows it in the script, and nothing else. The next token then depends on
the current token alone, and follows the script. Written with numpy, from the definition of the
checkpoint format (a JSON header, then the tensors' bytes), not with the engine's code.
"""

import json
import os
import struct

import numpy as np

HIDDEN = 64


def _byte_level_alphabet():
    """GPT-2's map of bytes to printable characters (tokenizers' ByteLevel)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_scripted_model(directory, script, chat_template, added=(), seed=0):
    """script: the answer's pieces (each becomes one token; added tokens by their text). The prompt
    must end in a newline (a chat's generation prompt does). added: extra added tokens
    (special=False) the template or script uses; <|im_start|> and <|im_end|> (the end token) always
    exist."""
    os.makedirs(directory, exist_ok=True)
    alphabet = _byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    added_tokens = []

    def add(text, special):
        vocab.setdefault(text, len(vocab))
        added_tokens.append({"id": vocab[text], "content": text, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": special})

    for text in ("<|im_start|>", "<|im_end|>"):
        add(text, True)
    for text in added:
        add(text, False)
    ids = []
    for piece in script:
        if piece not in vocab:
            vocab["".join(alphabet[b] for b in piece.encode())] = len(vocab)
            ids.append(len(vocab) - 1)
        else:
            ids.append(vocab[piece])
    chain = [vocab[alphabet[ord("\n")]]] + ids + [vocab["<|im_end|>"]]
    assert len(set(chain[:-1])) == len(chain) - 1, "each token of the script may occur once"
    size = len(vocab)

    rng = np.random.default_rng(seed)
    embed = rng.normal(0, 0.02, (size, HIDDEN))
    head = np.zeros((size, HIDDEN))
    for i, (current, following) in enumerate(zip(chain, chain[1:])):
        embed[current] = 0
        embed[current, i] = 1.0  # orthonormal: each current token its own axis
        head[following, i] = 10.0
    layer = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": embed,
        layer + "input_layernorm.weight": np.ones(HIDDEN),
        layer + "self_attn.q_proj.weight": rng.normal(0, 0.02, (HIDDEN, HIDDEN)),
        layer + "self_attn.k_proj.weight": rng.normal(0, 0.02, (HIDDEN // 2, HIDDEN)),
        layer + "self_attn.v_proj.weight": rng.normal(0, 0.02, (HIDDEN // 2, HIDDEN)),
        layer + "self_attn.o_proj.weight": np.zeros((HIDDEN, HIDDEN)),
        layer + "post_attention_layernorm.weight": np.ones(HIDDEN),
        layer + "mlp.gate_proj.weight": rng.normal(0, 0.02, (2 * HIDDEN, HIDDEN)),
        layer + "mlp.up_proj.weight": rng.normal(0, 0.02, (2 * HIDDEN, HIDDEN)),
        layer + "mlp.down_proj.weight": np.zeros((HIDDEN, 2 * HIDDEN)),
        "model.norm.weight": np.ones(HIDDEN),
        "lm_head.weight": head,
    }
    _write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    end = vocab["<|im_end|>"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "vocab_size": size, "tie_word_embeddings": False,
              "eos_token_id": end, "torch_dtype": "float32", "hidden_act": "silu"}
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    tokenizer = {
        "version": "1.0", "added_tokens": added_tokens, "normalizer": None, "post_processor": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    files = {
        "config.json": config,
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {"eos_token": "<|im_end|>", "chat_template": chat_template},
        "generation_config.json": {"eos_token_id": end},
    }
    for name, doc in files.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(doc, f, ensure_ascii=False)


TOOL_CALL = ["<tool_call>", '{"name":"get_weather",', '"arguments":{"city":"Paris"}}', "</tool_call>"]


def qwen_tools_template():
    """Qwen2.5's chat template (it renders tools and Hermes calls), from tests/data."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "tests", "data", "chat_templates.json")) as f:
        return next(t["template"] for t in json.load(f) if t["name"] == "qwen2.5/tools")


def write_tool_calling_model(directory):
    """A model with Qwen2.5's chat template (tools, Hermes calls) that answers any chat with a call
    of get_weather for Paris."""
    write_scripted_model(directory, TOOL_CALL, qwen_tools_template(), added=("<tool_call>", "</tool_call>"))
