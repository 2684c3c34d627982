// SentencePiece tokenizers (Debian's libsentencepiece), for tally-prep only:
// the trainer reads token ids and never links this.
#ifndef TALLY_WORKER_DATA_SENTENCEPIECE_H_
#define TALLY_WORKER_DATA_SENTENCEPIECE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace tally::data::spm {
class Processor;
}  // namespace tally::data::spm

namespace tally::data {

class SentencePieceTokenizer {
 public:
  // Loads a SentencePiece model file (tokenizer.model). InvalidArgument
  // naming the file when it is not one; NotFound when it is missing.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& path);
  ~SentencePieceTokenizer();

  // Appends [BOS,] the ids of `text`[, EOS] (BOS and EOS where the model
  // defines them).
  absl::Status Encode(absl::string_view text, std::vector<uint32_t>* out) const;
  // Kind "sentencepiece", the model's vocabulary and special ids, the
  // model file's path and SHA-256.
  const TokenizerRecord& record() const { return record_; }

 private:
  SentencePieceTokenizer();
  std::unique_ptr<spm::Processor> sp_;
  TokenizerRecord record_;
};

struct TrainTokenizerOptions {
  int64_t vocab_size = 8000;
  std::string model_type = "bpe";  // or "unigram"
  std::string out;                 // the model file to write (tok.model)
  // Sentences (lines of the documents) the trainer samples from.
  int64_t max_sentences = 1000000;
};

// Trains a SentencePiece model on `documents` (their lines are its
// sentences) and writes options.out (and, beside it, the .vocab that
// SentencePiece writes). BOS is id 1 and EOS id 2 (<unk> 0), as in Llama's
// tokenizers. InvalidArgument for options the trainer refuses (its message
// passed on), e.g. a vocabulary larger than the text allows.
absl::Status TrainSentencePiece(const std::vector<std::string>& documents,
                                const TrainTokenizerOptions& options);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_SENTENCEPIECE_H_
