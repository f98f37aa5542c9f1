"""Fewshot prompts as lm-evaluation-harness builds them (lm_eval/api/samplers.py's ContextSampler and FirstNSampler,
api/task.py's fewshot_context, written here from that source; lm_eval itself is not installed), for the oracle of
castor eval --num-fewshot (tests/text/mc_task_test.cpp).

  fewshot_oracle.py CASE.json OUT.json
CASE: {"format": "piqa"|"arc"|"mmlu"|"choices", "docs": [rows], "fewshot": [rows], "num_fewshot": n, "seed": s,
"sampler": "default"|"first_n", "eval_doc": bool (fewshot_split == test_split), "limit": n}. OUT: each evaluated row's
context (description, the examples each followed by "\\n\\n", its own prompt).

One sampler a task, seeded once (task.set_fewshot_seed), drawing for each evaluated row in order; MMLU's per-subject
tasks have one each, over their subject's rows.
"""
import json
import random
import sys

LETTERS = "ABCD"


def doc_to_text(fmt, d):
    if fmt == "piqa":
        return f"Question: {d['goal']}\nAnswer:"
    if fmt == "arc":
        return f"Question: {d['question']}\nAnswer:"
    if fmt == "mmlu":
        return d["question"].strip() + "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(d["choices"])) + "\nAnswer:"
    return d["context"]


def doc_to_target(fmt, d):
    if fmt == "piqa":
        return [d["sol1"], d["sol2"]][d["label"]]
    if fmt == "arc":
        return d["choices"]["text"][d["choices"]["label"].index(d["answerKey"])]
    if fmt == "mmlu":
        return LETTERS[d["answer"]]
    return d["choices"][d["label"]]


class ContextSampler:
    def __init__(self, df, seed):
        self.df, self.rnd = list(df), random.Random(seed)

    def sample(self, n, eval_doc=None):
        if eval_doc is None:
            return self.rnd.sample(self.df, n)
        return [x for x in self.rnd.sample(self.df, n + 1) if x != eval_doc][:n]


class FirstNSampler(ContextSampler):
    def sample(self, n, eval_doc=None):
        pool = [x for x in self.df if x != eval_doc] if eval_doc is not None else self.df
        assert n <= len(pool)
        return pool[:n]


def main():
    c = json.load(open(sys.argv[1]))
    fmt, n = c["format"], c["num_fewshot"]
    cls = FirstNSampler if c["sampler"] == "first_n" else ContextSampler
    samplers = {}
    out = []
    for doc in c["docs"][: c["limit"]]:
        subject = doc.get("subject", "") if fmt == "mmlu" else ""
        if subject not in samplers:
            samplers[subject] = cls([d for d in c["fewshot"] if fmt != "mmlu" or d.get("subject", "") == subject],
                                    c["seed"])
        prompt = ""
        if fmt == "mmlu" and subject:
            prompt = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        for fs in samplers[subject].sample(n, eval_doc=doc if c["eval_doc"] else None):
            prompt += doc_to_text(fmt, fs) + " " + doc_to_target(fmt, fs) + "\n\n"
        out.append(prompt + doc_to_text(fmt, doc))
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
