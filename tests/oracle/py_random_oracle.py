"""CPython's own random module (the oracle of src/text/py_random.h): for each case, random.Random(seed)'s first
getrandbits(32) words, then a second random.Random(seed)'s samples of range(n) of k elements, drawn one after another
from the one generator (as lm-evaluation-harness's ContextSampler draws each document's fewshot examples).

  py_random_oracle.py CASES.json OUT.json
CASES: [{"seed": int, "words": int, "draws": [[n, k], ...]}]; OUT: [{"words": [...], "samples": [[...], ...]}].
"""
import json
import random
import sys


def main():
    cases = json.load(open(sys.argv[1]))
    out = []
    for c in cases:
        r = random.Random(c["seed"])
        words = [r.getrandbits(32) for _ in range(c["words"])]
        r = random.Random(c["seed"])
        samples = [r.sample(range(n), k) for n, k in c["draws"]]
        out.append({"words": words, "samples": samples})
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
