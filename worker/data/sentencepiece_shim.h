// The SentencePiece library behind a plain C++ interface. Its headers
// declare `absl::string_view` as std::string_view, which clashes with the
// Abseil the rest of Tally uses: only sentencepiece_shim.cc includes them,
// and this header includes no Abseil.
#ifndef TALLY_WORKER_DATA_SENTENCEPIECE_SHIM_H_
#define TALLY_WORKER_DATA_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tally::data::spm {

class Processor {
 public:
  Processor();
  ~Processor();
  // Errors are returned as text; "" is success.
  std::string Load(const std::string& serialized_model);
  std::string Encode(const std::string& text, std::vector<int>* ids) const;
  int PieceSize() const;
  int BosId() const;  // -1: none
  int EosId() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SentencePieceTrainer::Train over `sentences` with the trainer's flags by
// name; "" on success, else the trainer's message.
std::string Train(const std::vector<std::string>& sentences,
                  const std::unordered_map<std::string, std::string>& flags);

}  // namespace tally::data::spm

#endif  // TALLY_WORKER_DATA_SENTENCEPIECE_SHIM_H_
