#include "worker/data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace tally::data::spm {

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Processor::Processor() : impl_(std::make_unique<Impl>()) {}
Processor::~Processor() = default;

std::string Processor::Load(const std::string& serialized_model) {
  const auto s = impl_->sp.LoadFromSerializedProto(serialized_model);
  return s.ok() ? "" : s.ToString();
}

std::string Processor::Encode(const std::string& text, std::vector<int>* ids) const {
  const auto s = impl_->sp.Encode(text, ids);
  return s.ok() ? "" : s.ToString();
}

int Processor::PieceSize() const { return impl_->sp.GetPieceSize(); }
int Processor::BosId() const { return impl_->sp.bos_id(); }
int Processor::EosId() const { return impl_->sp.eos_id(); }

namespace {

class Sentences : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return at_ >= lines_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return lines_[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t at_ = 0;
};

}  // namespace

std::string Train(const std::vector<std::string>& sentences,
                  const std::unordered_map<std::string, std::string>& flags) {
  Sentences it(sentences);
  const auto s = sentencepiece::SentencePieceTrainer::Train(flags, &it);
  return s.ok() ? "" : s.ToString();
}

}  // namespace tally::data::spm
