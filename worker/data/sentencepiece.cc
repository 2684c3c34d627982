#include "worker/data/sentencepiece.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/data/sentencepiece_shim.h"

namespace tally::data {

SentencePieceTokenizer::SentencePieceTokenizer() : sp_(std::make_unique<spm::Processor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file (the SentencePiece model)"));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a SentencePiece model file"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string model = bytes.str();
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  const std::string error = t->sp_->Load(model);
  if (!error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a SentencePiece model (", error,
        "); give the .model file, e.g. a Llama 2 tokenizer.model or one from tally-prep "
        "train-tokenizer"));
  }
  t->record_.kind = "sentencepiece";
  t->record_.vocab_size = t->sp_->PieceSize();
  t->record_.bos = t->sp_->BosId();
  t->record_.eos = t->sp_->EosId();
  t->record_.model_path = path;
  t->record_.model_sha256 = Sha256Hex(model.data(), model.size());
  if (t->record_.vocab_size < 1 || t->record_.vocab_size > kMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a vocabulary of ", t->record_.vocab_size, " pieces"));
  }
  return t;
}

absl::Status SentencePieceTokenizer::Encode(absl::string_view text,
                                            std::vector<uint32_t>* out) const {
  std::vector<int> ids;
  const std::string error = sp_->Encode(std::string(text), &ids);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  if (record_.bos >= 0) out->push_back(static_cast<uint32_t>(record_.bos));
  for (int id : ids) out->push_back(static_cast<uint32_t>(id));
  if (record_.eos >= 0) out->push_back(static_cast<uint32_t>(record_.eos));
  return absl::OkStatus();
}

absl::Status TrainSentencePiece(const std::vector<std::string>& documents,
                                const TrainTokenizerOptions& options) {
  if (options.model_type != "bpe" && options.model_type != "unigram") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_type: must be bpe or unigram, got \"", options.model_type, "\""));
  }
  if (!absl::EndsWith(options.out, ".model") || options.out.size() <= 6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out: must name the model file, ending in .model (got \"", options.out, "\")"));
  }
  // The documents' lines are the trainer's sentences.
  std::vector<std::string> sentences;
  for (const std::string& d : documents) {
    for (absl::string_view line : absl::StrSplit(d, '\n', absl::SkipWhitespace())) {
      if (static_cast<int64_t>(sentences.size()) >= options.max_sentences) break;
      sentences.emplace_back(line);
    }
  }
  if (sentences.empty()) return absl::InvalidArgumentError("no text to train a tokenizer on");
  // The map form of the trainer's flags: no quoting of paths.
  const std::unordered_map<std::string, std::string> flags = {
      {"model_prefix", options.out.substr(0, options.out.size() - 6)},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", options.model_type},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},  // no <unk> for text outside the training set
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"minloglevel", "1"},
  };
  const std::string error = spm::Train(sentences, flags);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat("SentencePiece: ", error));
  return absl::OkStatus();
}

}  // namespace tally::data
