#!/usr/bin/env python3
"""Writes tests/fixtures/bpe: a small GPT-2-style byte-level BPE vocabulary learned from a text, in the files GPT-2's
is published as (vocab.json + merges.txt, and Hugging Face's tokenizer.json), and the pieces and ids that OpenAI's
encoder.py gives for a set of texts and for the whole source text (cases.json), which gpt-train's tokenizer must reproduce (tests/data/bpe_test.cc).

The encoder below is OpenAI's gpt-2/src/encoder.py (MIT), unchanged but for reading the vocabulary from memory; the
pattern runs on the `regex` module as there. Run with Debian's interpreter and python3-regex:

    /usr/bin/python3 scripts/reference/gpt2_bpe_fixture.py ../shared/data/tinyshakespeare.txt tests/fixtures/bpe
"""
import collections
import json
import os
import sys

import regex as re

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    cs = [chr(n) for n in cs]
    return dict(zip(bs, cs))


def get_pairs(word):
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


class Encoder:
    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}
        self.pat = re.compile(PATTERN)

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            new_word = tuple(new_word)
            word = new_word
            if len(word) == 1:
                break
            else:
                pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def encode(self, text):
        bpe_tokens = []
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens


def learn_merges(text, count):
    """Byte-level BPE training: the most frequent adjacent pair within the pattern's pieces, merged, `count` times
    (ties broken by the pair's text, so the result is the same on every machine)."""
    byte_encoder = bytes_to_unicode()
    words = collections.Counter(
        tuple(byte_encoder[b] for b in piece.encode("utf-8")) for piece in re.findall(PATTERN, text))
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


CASES = [
    "Hello world",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "I'm sure they'll say it's what we've done, and he'd agree; they're right. 'tis so.",
    "Caps: I'M, IT'S, THEY'LL (the pattern's contractions are lowercase only)",
    "'''s ''re 'x 'sup",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\nand\r\nCRLF",
    "numbers 12345 3.14159 1,000,000 and 2nd 3rd",
    "café naïve résumé Ærøskøbing straße",
    "e\u0301 (a combining accent is neither a letter nor a number)",
    "Привет, мир! Καλημέρα κόσμε. שלום עולם. مرحبا بالعالم",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "digits of other scripts: ٣٤٥ ४५६ ௫ and ² ½ Ⅻ",
    "emoji 😀👍🏽 and symbols ©®™ → ∑∞ ≠",
    "no-break\u00a0space, ideographic\u3000space, thin\u2009space, em\u2003space",
    "line\u2028separator and\u0085next line",
    "punctuation!!! ??? ... --- *** ((())) [[x]] {y} <z>",
    "<|endoftext|> is text here, not the special token",
    "x",
    " ",
    "\n",
    "",
]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in (i & 0xFF, i >> 8):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    source, out = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    merges = learn_merges(text, 600)
    byte_encoder = bytes_to_unicode()
    tokens = [byte_encoder[b] for b in byte_encoder]  # the bytes in bytes_to_unicode's order, as GPT-2's ids 0-255
    tokens += [a + b for a, b in merges] + ["<|endoftext|>"]
    encoder = {t: i for i, t in enumerate(tokens)}
    assert len(encoder) == len(tokens)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    hf = {
        "version": "1.0",
        "added_tokens": [{"id": len(tokens) - 1, "content": "<|endoftext|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": encoder, "merges": [[a, b] for a, b in merges]},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(hf, f, ensure_ascii=True)  # \u escapes, which the loader must read too
    enc = Encoder(encoder, merges)
    # The texts (CASES above) and pieces as the hex of their UTF-8 bytes: JSON writes astral characters as surrogate
    # pairs, which yaml-cpp (the test reads the file with it) refuses.
    cases = [{"utf8": t.encode().hex(), "pieces": [p.encode().hex() for p in re.findall(PATTERN, t)],
              "ids": enc.encode(t)} for t in CASES]
    ids = enc.encode(text)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        head = {"source": os.path.basename(source), "source_tokens": len(ids), "source_fnv1a64": f"{fnv1a64(ids):#018x}"}
        f.write(json.dumps(head)[:-1] + ',\n"cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=True) for c in cases) + "\n]}\n")
    print(f"{len(tokens)} tokens, {len(merges)} merges; {source}: {len(text)} characters -> {len(ids)} ids")


if __name__ == "__main__":
    main()
