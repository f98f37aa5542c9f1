# sentencepiece itself (Debian's python3-sentencepiece) trains a vocabulary with llama2.c's train_vocab settings, and
# the result is written as llama2.c's tokenizer.py export writes tokenizer.bin: max_token_length, then per piece
# (U+2581 as ' ', <s> and </s> wrapped in newlines) its float score, its byte length and its bytes. For
# tests/text/bpe_tokenizer_test.cpp, which compares Castor's trainer with it byte for byte.
#
#   sentencepiece_vocab_oracle.py TEXT_FILE VOCAB_SIZE OUT_DIR   -> OUT_DIR/spm_tokenizer.bin
import struct
import sys

import sentencepiece as spm


def main():
    text, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=f"{out}/spm", model_type="bpe", vocab_size=size, self_test_sample_size=0,
        input_format="text", character_coverage=1.0, num_threads=1, split_digits=True,
        allow_whitespace_only_pieces=True, byte_fallback=True, unk_surface=r" \342\201\207 ",
        normalization_rule_name="identity", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=f"{out}/spm.model")
    pieces, scores = [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        piece = {sp.bos_id(): "\n<s>\n", sp.eos_id(): "\n</s>\n"}.get(i, piece).replace("\u2581", " ")
        pieces.append(piece.encode("utf-8"))
        scores.append(sp.get_score(i))
    with open(f"{out}/spm_tokenizer.bin", "wb") as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for p, s in zip(pieces, scores):
            f.write(struct.pack("<fi", s, len(p)) + p)


if __name__ == "__main__":
    main()
