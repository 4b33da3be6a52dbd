#!/usr/bin/python3
"""An independent reference for byte-level BPE tokenizers, written from the definitions (GPT-2's
encoder.py: bytes_to_unicode and bpe(); Hugging Face tokenizers' tokenizer.json, its added tokens
and its Split/ByteLevel pre-tokenizers), with the `regex` module for the Unicode patterns.

  tokenizer_reference.py train CORPUS --merges N --style STYLE --out tokenizer.json [--ignore-merges] [--nfc]
      learns N merges from CORPUS (the most frequent adjacent pair of symbols, the smallest pair
      on a tie) and writes a tokenizer.json, with three special added tokens. STYLE: gpt2, llama3,
      qwen2 (byte-level); sentencepiece (Llama 2's: Prepend and Replace normalizers, byte
      fallback) or metaspace (the same with a Metaspace pre-tokenizer, prepend_scheme "first")
  tokenizer_reference.py encode tokenizer.json TEXTS.json
      prints, as JSON, the ids of each text of the JSON list in TEXTS.json
"""

import argparse
import collections
import json
import sys

import unicodedata

import regex

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
SPECIALS = ["<|begin_of_text|>", "<|end|>", "<|end|>>"]  # the last starts as the second does
SP_SPECIALS = ["<unk>", "<s>", "</s>"]
METASPACE = "\u2581"
SP_STYLES = ("sentencepiece", "metaspace")


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest for 256 onwards."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE = bytes_to_unicode()


def pieces(pattern, text):
    """Split with behaviour Isolated: each match, and any text between matches."""
    out, last = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > last:
            out.append(text[last : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        last = max(last, m.end())
    if last < len(text):
        out.append(text[last:])
    return out


def symbols(piece):
    return "".join(BYTE[b] for b in piece.encode("utf-8"))


def learn_merges(words, merges_wanted, vocab):
    """BPE training: merge the most frequent adjacent pair of symbols (the smallest pair on a tie)
    in every word, merges_wanted times; each merged symbol joins vocab. words: Counter of tuples."""
    merges = []
    while len(merges) < merges_wanted:
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        words = collections.Counter({tuple(bpe(list(w), {best: 0})): c for w, c in words.items()})
    return merges


def train(corpus, merges_wanted, style, ignore_merges, nfc=False):
    words = collections.Counter(tuple(symbols(p)) for p in pieces(PATTERNS[style], corpus))
    vocab = {BYTE[b]: b for b in range(256)}
    merges = learn_merges(words, merges_wanted, vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": style == "gpt2"}
    if style == "gpt2":
        pre = byte_level
    else:
        split = {"type": "Split", "pattern": {"Regex": PATTERNS[style]}, "behavior": "Isolated", "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    added = [
        {"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]
    return {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def sp_symbols(word, vocab):
    """A word's starting symbols: its characters, and for a character the vocabulary lacks its
    bytes' tokens (SentencePiece's byte fallback)."""
    out = []
    for ch in word:
        if ch in vocab:
            out.append(ch)
        else:
            out.extend(f"<0x{b:02X}>" for b in ch.encode("utf-8"))
    return out


def sp_words(text, style, at_start):
    """The words BPE encodes, for one run of text between added tokens."""
    if not text:
        return []
    replaced = text.replace(" ", METASPACE)
    if style == "sentencepiece":  # the Prepend normalizer: before every run
        return [METASPACE + replaced]
    if at_start and not replaced.startswith(METASPACE):  # Metaspace, prepend_scheme "first"
        replaced = METASPACE + replaced
    return [replaced]


def train_sp(corpus, merges_wanted, style):
    vocab = {s: i for i, s in enumerate(SP_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    text = corpus.replace(" ", METASPACE)
    for ch, n in sorted(collections.Counter(text).items()):
        if n >= 2 and ch not in vocab:  # characters seen once are left to the byte fallback
            vocab[ch] = len(vocab)
    # Words as SentencePiece sees them: each begins at its '▁'.
    words = collections.Counter()
    for word in regex.findall(METASPACE + "?[^" + METASPACE + "]+|" + METASPACE, METASPACE + text):
        words[tuple(sp_symbols(word, vocab))] += 1
    merges = learn_merges(words, merges_wanted, vocab)
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    if style == "sentencepiece":
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": METASPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": METASPACE}]}
        pre = None
    else:
        normalizer = None
        pre = {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "first", "split": False}
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, s in enumerate(SP_SPECIALS)
    ]
    return {
        "version": "1.0", "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre,
        "post_processor": None, "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def bpe(word, ranks):
    """GPT-2's bpe(): merge the best-ranked adjacent pair everywhere, until none has a rank.
    word: a string (its characters) or a list of symbols."""
    word = list(word)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == best[0] and word[i + 1] == best[1]:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


def style_of(tok):
    if tok["model"].get("byte_fallback"):
        return "sentencepiece" if tok["pre_tokenizer"] is None else "metaspace"
    return "byte-level"


def encode(tok, text):
    model = tok["model"]
    vocab = model["vocab"]
    ranks = {}
    for i, m in enumerate(model["merges"]):  # a repeated merge takes its last place, as in HF's map
        pair = tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
        ranks[pair] = i
    style = style_of(tok)
    pre = tok["pre_tokenizer"]
    if style == "byte-level":
        pattern = PATTERNS["gpt2"] if pre["type"] == "ByteLevel" else pre["pretokenizers"][0]["pattern"]["Regex"]
    added = {a["content"]: a for a in tok["added_tokens"]}
    ids = []

    def plain(part, at_start):
        if style != "byte-level":
            for word in sp_words(part, style, at_start):
                ids.extend(vocab.get(s, vocab["<unk>"]) for s in bpe(sp_symbols(word, vocab), ranks))
            return
        if (tok.get("normalizer") or {}).get("type") == "NFC":  # each run between added tokens
            part = unicodedata.normalize("NFC", part)
        for piece in pieces(pattern, part):
            word = symbols(piece)
            if model.get("ignore_merges") and word in vocab:
                ids.append(vocab[word])
            else:
                ids.extend(vocab[s] for s in bpe(word, ranks))

    # Added tokens: the leftmost occurrence first, the longest where several start there, never
    # overlapping. single_word: one with a word character just before or after it is no match (the
    # search goes on after it). lstrip / rstrip: the whitespace before (back to the end of the
    # text already taken) or after it goes with the token.
    start = 0  # the text not yet encoded
    search = 0  # where the search for the next occurrence goes on
    while True:
        found = None
        for content in added:
            at = text.find(content, search)
            if at >= 0 and (found is None or at < found[0] or (at == found[0] and len(content) > len(found[1]))):
                found = (at, content)
        if found is None:
            break
        at, content = found
        end = at + len(content)
        a = added[content]
        if a.get("single_word") and ((at > 0 and _is_word(text[at - 1])) or (end < len(text) and _is_word(text[end]))):
            search = end
            continue
        if a.get("lstrip"):
            while at > start and text[at - 1] in WHITE_SPACE:
                at -= 1
        if a.get("rstrip"):
            while end < len(text) and text[end] in WHITE_SPACE:
                end += 1
        plain(text[start:at], start == 0)
        ids.append(a["id"])
        start = search = end
    plain(text[start:], start == 0)
    return ids


# Unicode's White_Space property, and the characters of a Unicode regex's \w (letters, marks,
# decimal and letter numbers, connector punctuation, the two joiners): what Hugging Face's
# tokenizers strip and take for words around added tokens.
WHITE_SPACE = set(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                            0x202F, 0x205F, 0x3000]))


def _is_word(c):
    category = unicodedata.category(c)
    return category[0] in "LM" or category in ("Nd", "Nl", "Pc") or c in "\u200c\u200d"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train")
    t.add_argument("corpus")
    t.add_argument("--merges", type=int, required=True)
    t.add_argument("--style", choices=sorted(PATTERNS) + list(SP_STYLES), required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--ignore-merges", action="store_true")
    t.add_argument("--nfc", action="store_true", help="byte-level styles: an NFC normalizer (Qwen2's)")
    e = commands.add_parser("encode")
    e.add_argument("tokenizer")
    e.add_argument("texts")
    args = parser.parse_args()
    if args.command == "train":
        with open(args.corpus, encoding="utf-8") as f:
            corpus = f.read()
        if args.style in SP_STYLES:
            tokenizer = train_sp(corpus, args.merges, args.style)
        else:
            tokenizer = train(corpus, args.merges, args.style, args.ignore_merges, args.nfc)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(tokenizer, f, ensure_ascii=False)
    else:
        with open(args.tokenizer, encoding="utf-8") as f:
            tok = json.load(f)
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
        json.dump([encode(tok, text) for text in texts], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
