#!/usr/bin/env python3
"""Reference for kiln's llama2.c tokenizer test: a literal port of run.c's
encode() (O(n^2) rescans, bsearch-free dict lookup). Written independently of
the C++ code, which uses a heap.

usage: llama2c_tok_ref.py TOKENIZER_BIN IN_JSON OUT_JSON
IN_JSON: list of {"text_hex": hex of the UTF-8 bytes, "bos": bool, "eos": bool}
OUT_JSON: list of lists of ids
"""
import json
import struct
import sys


def load(path):
    data = open(path, "rb").read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off = 4
    vocab, scores = [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(score)
        off += n
    lookup = {}
    for i, piece in enumerate(vocab):
        lookup.setdefault(piece, i)
    return vocab, scores, lookup


def encode(vocab, scores, lookup, text, bos, eos):
    tokens = []
    if bos:
        tokens.append(1)
    if len(text) > 0:
        tokens.append(lookup[b" "])
    buf = b""
    for i in range(len(text)):
        c = text[i]
        if (c & 0xC0) != 0x80:
            buf = b""
        buf += bytes([c])
        nxt = text[i + 1] if i + 1 < len(text) else 0
        if (nxt & 0xC0) == 0x80 and len(buf) < 4:
            continue
        if buf in lookup:
            tokens.append(lookup[buf])
        else:
            for b in buf:
                tokens.append(b + 3)
        buf = b""
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            pid = lookup.get(vocab[tokens[i]] + vocab[tokens[i + 1]], -1)
            if pid != -1 and scores[pid] > best_score:
                best_score, best_id, best_idx = scores[pid], pid, i
        if best_idx == -1:
            break
        tokens[best_idx] = best_id
        del tokens[best_idx + 1]
    if eos:
        tokens.append(2)
    return tokens


def main():
    vocab, scores, lookup = load(sys.argv[1])
    cases = json.load(open(sys.argv[2]))
    out = [encode(vocab, scores, lookup, bytes.fromhex(c["text_hex"]), c["bos"], c["eos"])
           for c in cases]
    json.dump(out, open(sys.argv[3], "w"))


if __name__ == "__main__":
    main()
