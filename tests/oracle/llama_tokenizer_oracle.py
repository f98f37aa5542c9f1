# llama2.c's tokenizer as its run.c reads and applies it, written from run.c's published build_tokenizer and encode
# for tests/text/bpe_tokenizer_test.cpp: reads tokenizer.bin (int max_token_length, then per piece float score,
# int length, bytes; pieces until the end of the file, run.c's vocab_size) and encodes each prompt with <s> first,
# the dummy prefix " ", run.c's UTF-8 grouping with byte fallback (id 3 + byte), then the merge loop: the adjacent
# pair whose joined bytes are the piece with the highest score (strictly above -1e10, the leftmost of equals).
#
#   llama_tokenizer_oracle.py TOKENIZER_BIN PROMPTS_JSON OUT_DIR
# PROMPTS_JSON: a JSON list of prompts, each its bytes in hex. Writes OUT_DIR/llama_tokens.bin
# (tests/oracle/oracle_io.py's format): "ids.I" (int64 [n]) for prompt I.
import json
import struct
import sys

import torch

from oracle_io import write_case


def read_tokenizer(path):
    data = open(path, "rb").read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    pieces, scores, at = [], [], 4
    while at < len(data):
        score, n = struct.unpack_from("<fi", data, at)
        pieces.append(data[at + 8: at + 8 + n])
        scores.append(score)
        at += 8 + n
    assert max(len(p) for p in pieces) <= max_len
    return pieces, scores


def encode(text, pieces, scores):
    lookup = {p: i for i, p in enumerate(pieces)}
    tokens = [1]
    if text:
        tokens.append(lookup[b" "])
    buf = b""
    for k, c in enumerate(text):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        nxt = text[k + 1] if k + 1 < len(text) else 0
        if nxt & 0xC0 == 0x80 and len(buf) < 4:
            continue
        tokens.extend([lookup[buf]] if buf in lookup else [b + 3 for b in buf])
        buf = b""
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(tokens) - 1):  # <s> too, as in run.c
            m = lookup.get(pieces[tokens[i]] + pieces[tokens[i + 1]], -1)
            if m != -1 and scores[m] > best_score:
                best_score, best_id, best_idx = scores[m], m, i
        if best_idx == -1:
            return tokens
        tokens[best_idx: best_idx + 2] = [best_id]


def main():
    pieces, scores = read_tokenizer(sys.argv[1])
    prompts = [bytes.fromhex(h) for h in json.load(open(sys.argv[2]))]
    out = {f"ids.{i}": torch.tensor(encode(p, pieces, scores), dtype=torch.int64) for i, p in enumerate(prompts)}
    write_case(sys.argv[3], "llama_tokens", out)


if __name__ == "__main__":
    main()
