// Learning a llama2.c vocabulary: sentencepiece's BPE training with byte fallback, as llama2.c's train_vocab runs it.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

#include "castor/bpe_tokenizer.h"

namespace castor::data {

// Learns a vocabulary of exactly `vocab_size` pieces (259..65536) from `texts` as sentencepiece's BPE trainer does
// with llama2.c's settings (model_type bpe, byte_fallback, character_coverage 1, split_digits,
// allow_whitespace_only_pieces, identity normalization, add_dummy_prefix):
// - each line of each text is a sentence, its spaces normalized as sentencepiece's default remove_extra_whitespaces
//   does (none at either end, a run as one; lines left empty are skipped): "▁" (U+2581) before it and in place of
//   each ' ', then split into words before each '▁' that follows another character (a run of '▁', possible only
//   from literal U+2581 characters, starts the word after it);
// - ids 0-2 <unk> <s> </s> and 3-258 the byte pieces, score 0; then the merges, the k-th scored -k: the most frequent
//   adjacent pair of symbols (ties: the shorter piece, then the smaller string) becomes one symbol everywhere, if
//   the joined piece is valid (at most 16 characters; '▁' only as its first character unless all of it is '▁'; no
//   digit joined to anything; one script among its other characters) and not already a piece; then every character
//   as a piece, the most frequent first, scores continuing down from the last merge.
// Characters that do not fit (more distinct ones than vocab_size - 259) are left to byte fallback, the rarest first,
// and take part in no merge; so are NUL and tab, which sentencepiece never makes pieces. Unlike sentencepiece, lines
// of any length are learned from (it skips lines over 4192 bytes). Deterministic. castor::Error naming --vocab-size when it is out of range or the text
// gives fewer pieces than asked for.
// castor::Error naming --vocab-size unless 259 <= n <= 65536.
void check_bpe_vocab_size(int64_t n);
BpeVocabulary train_bpe_vocabulary(std::span<const std::string_view> texts, int64_t vocab_size);

}  // namespace castor::data
