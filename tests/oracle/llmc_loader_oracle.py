# llm.c's training data loader as llm.c's llmc/dataloader.h and llmc/rand.h define it (should_shuffle = 1), written
# from that published algorithm for tests/text/lm_batch_test.cpp. The Mersenne Twister is Python's own (the
# `random` module's MT19937 core), its state set to the words torch.manual_seed / llm.c's manual_seed make, so the
# twist and tempering are an independent implementation; the first draws are checked against the values llm.c's
# rand.h publishes and against torch's generator.
#
#   llmc_loader_oracle.py CONFIG OUT_DIR
# CONFIG is a JSON object: files (token files, in glob order), B, T, num_processes, process_rank, batches.
# Writes OUT_DIR/llmc_order.bin (tests/oracle/oracle_io.py's format): "x", "y" (int64 [batches, B, T]), "shard" and
# "sample" (int64 [batches]: which shard and which sample of it each batch was).
import json
import random
import struct
import sys

import torch

from oracle_io import write_case


def mt_seeded(seed):
    """A random.Random whose MT19937 state is init_genrand(seed), the state llm.c's manual_seed writes."""
    mt = [seed & 0xFFFFFFFF]
    for j in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + j) & 0xFFFFFFFF)
    r = random.Random()
    r.setstate((3, tuple(mt) + (624,), None))  # position 624: the first draw twists
    return r


def randint32(r):
    return r.getrandbits(32)


def random_permutation(data, r):
    for i in range(len(data) - 1, 0, -1):
        j = randint32(r) % (i + 1)
        data[i], data[j] = data[j], data[i]


def read_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        assert header[0] == 20240520 and header[1] == 1, path
        tokens = list(struct.unpack(f"<{header[2]}H", f.read(2 * header[2])))
    return tokens


def check_generator():
    # llm.c's rand.h: manual_seed(137) then randint32 five times.
    r = mt_seeded(137)
    assert [randint32(r) for _ in range(5)] == [4053805790, 2173880614, 380293709, 1237255315, 2986595568]
    # torch.manual_seed(42 + rank) is llm.c's shuffle seed: the same words (torch.randint over [0, 2^32 - 1)
    # draws one 32-bit word modulo the range).
    torch.manual_seed(43)
    r = mt_seeded(43)
    for _ in range(8):
        want = randint32(r)
        assert torch.randint(0, 0xFFFFFFFF, [1]).item() == want % 0xFFFFFFFF


class Loader:
    """dataloader_init / dataloader_reset / dataloader_next_batch with should_shuffle = 1."""

    def __init__(self, files, B, T, rank, nproc):
        self.files = [read_tokens(f) for f in files]
        self.B, self.T = B, T
        self.total = nproc * B * T  # tokens of one global batch
        self.local = rank * B * T
        self.rng = mt_seeded(42 + rank)
        self.shard_indices = list(range(len(files)))
        for toks in self.files:
            assert len(toks) >= self.total + 1
        self.reset()

    def load_shard(self, i):
        self.shard = self.shard_indices[i]
        self.num_samples = (len(self.files[self.shard]) - 1) // self.total
        self.intra = list(range(self.num_samples))
        random_permutation(self.intra, self.rng)

    def reset(self):
        self.shard_idx, self.sample_idx = 0, 0
        random_permutation(self.shard_indices, self.rng)
        self.load_shard(0)

    def next_batch(self):
        if self.sample_idx >= self.num_samples:
            if self.shard_idx == len(self.files) - 1:
                self.reset()
            else:
                self.shard_idx += 1
                self.sample_idx = 0
                self.load_shard(self.shard_idx)
        idx = self.intra[self.sample_idx]
        start = idx * self.total + self.local
        buf = self.files[self.shard][start:start + self.B * self.T + 1]
        self.sample_idx += 1
        return self.shard, idx, buf[:-1], buf[1:]


def main():
    c, out = json.loads(sys.argv[1]), sys.argv[2]
    check_generator()
    loader = Loader(c["files"], c["B"], c["T"], c["process_rank"], c["num_processes"])
    xs, ys, shards, samples = [], [], [], []
    for _ in range(c["batches"]):
        shard, idx, x, y = loader.next_batch()
        shards.append(shard)
        samples.append(idx)
        xs.append(x)
        ys.append(y)
    B, T = c["B"], c["T"]
    write_case(out, "llmc_order", {"x": torch.tensor(xs, dtype=torch.int64).reshape(-1, B, T),
                                   "y": torch.tensor(ys, dtype=torch.int64).reshape(-1, B, T),
                                   "shard": torch.tensor(shards, dtype=torch.int64),
                                   "sample": torch.tensor(samples, dtype=torch.int64)})


if __name__ == "__main__":
    main()
