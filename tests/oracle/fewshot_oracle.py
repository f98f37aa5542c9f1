"""Fewshot prompts as lm-evaluation-harness builds them (lm_eval/api/samplers.py's ContextSampler.get_context and
FirstNSampler, api/task.py's fewshot_context and construct_requests, tasks/hellaswag/utils.py's process_docs,
tasks/winogrande/preprocess_winogrande.py; written here from that source, lm_eval itself is not installed), for the
oracle of castor eval --num-fewshot (tests/text/mc_task_test.cpp).

  fewshot_oracle.py CASE.json OUT.json
CASE: {"format": "hellaswag"|"piqa"|"arc"|"mmlu"|"winogrande"|"choices", "docs": [rows], "fewshot": [rows],
"num_fewshot": n, "seed": s, "sampler": "default"|"first_n", "eval_doc": bool (fewshot_split == test_split),
"limit": n}. OUT: each evaluated row's contexts (description, the examples each followed by "\\n\\n", its own prompt):
one, or Winogrande's one per choice (the examples, then the sentence up to its blank filled with the option).

One sampler a task, seeded once (task.set_fewshot_seed), drawing for each evaluated row in order; MMLU's per-subject
tasks have one each, over their subject's rows. HellaSwag's fewshot rows are its training docs, process_docs applied
as to the evaluated ones.
"""
import json
import random
import re
import sys

LETTERS = "ABCD"


def hellaswag_preprocess(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def process_doc(fmt, d):
    """HellaSwag's process_docs (datasets.map: the row's fields kept, the new ones added); the others as read."""
    if fmt != "hellaswag":
        return d
    ctx = d["ctx_a"] + " " + d["ctx_b"].capitalize()
    return dict(d, query=hellaswag_preprocess(d["activity_label"] + ": " + ctx),
                choices=[hellaswag_preprocess(e) for e in d["endings"]], gold=int(d["label"]))


def blank(d):
    return d["sentence"].index("_")


def doc_to_choice(fmt, d):
    if fmt == "winogrande":
        return [d["sentence"][: blank(d)] + o for o in (d["option1"], d["option2"])]
    if fmt == "hellaswag":
        return d["choices"]
    return None


def doc_to_text(fmt, d):
    """A string, or Winogrande's gold index (its doc_to_text: multiple inputs, the choice is the context)."""
    if fmt == "hellaswag":
        return d["query"]
    if fmt == "winogrande":
        return {"1": 0, "2": 1}[d["answer"]]
    if fmt == "piqa":
        return f"Question: {d['goal']}\nAnswer:"
    if fmt == "arc":
        return f"Question: {d['question']}\nAnswer:"
    if fmt == "mmlu":
        return d["question"].strip() + "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(d["choices"])) + "\nAnswer:"
    return d["context"]


def doc_to_target(fmt, d):
    if fmt == "hellaswag":
        return d["choices"][d["gold"]]
    if fmt == "winogrande":
        return d["sentence"][blank(d) + 1 :].strip()
    if fmt == "piqa":
        return [d["sol1"], d["sol2"]][d["label"]]
    if fmt == "arc":
        return d["choices"]["text"][d["choices"]["label"].index(d["answerKey"])]
    if fmt == "mmlu":
        return LETTERS[d["answer"]]
    return d["choices"][d["label"]]


class ContextSampler:
    def __init__(self, fmt, docs, seed):
        self.fmt, self.docs, self.rnd = fmt, list(docs), random.Random(seed)

    def sample(self, n):
        return self.rnd.sample(self.docs, n)

    def get_context(self, doc, num_fewshot, eval_doc):
        n_samples = num_fewshot + 1 if eval_doc else num_fewshot
        selected = [x for x in self.sample(n_samples) if x != doc][:num_fewshot]
        out = ""
        for d in selected:
            text = doc_to_text(self.fmt, d)
            out += text if isinstance(text, str) else doc_to_choice(self.fmt, d)[text]
            out += " " + doc_to_target(self.fmt, d) + "\n\n"
        return out


class FirstNSampler(ContextSampler):
    def sample(self, n):
        assert n <= len(self.docs)
        return self.docs[:n]


def main():
    c = json.load(open(sys.argv[1]))
    fmt, n = c["format"], c["num_fewshot"]
    cls = FirstNSampler if c["sampler"] == "first_n" else ContextSampler
    fewshot = [process_doc(fmt, d) for d in c["fewshot"]]
    samplers = {}
    out = []
    for doc in [process_doc(fmt, d) for d in c["docs"][: c["limit"]]]:
        subject = doc.get("subject", "") if fmt == "mmlu" else ""
        if subject not in samplers:
            samplers[subject] = cls(fmt, [d for d in fewshot if fmt != "mmlu" or d.get("subject", "") == subject],
                                    c["seed"])
        ctx = ""
        if fmt == "mmlu" and subject:
            ctx = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        ctx += samplers[subject].get_context(doc, n, c["eval_doc"])
        if fmt == "winogrande":  # fewshot_context returns the examples alone; each choice is appended to them
            out.append([ctx + choice for choice in doc_to_choice(fmt, doc)])
        else:
            out.append([ctx + doc_to_text(fmt, doc)])
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
