#include "worker/agent/log_capture.h"

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_split.h"
#include "common/log_lines.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace tally::worker {
namespace {

struct ThreadScope {
  LogCapture* capture = nullptr;
  AttemptLogKey key;
  std::string source;
};
thread_local ThreadScope* current_scope = nullptr;

const char* LevelName(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::warn: return "warning";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "info";
  }
}

class AttemptLogSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    ThreadScope* scope = current_scope;
    if (scope == nullptr || scope->capture == nullptr) return;
    const absl::Time t = absl::FromChrono(msg.time);
    scope->capture->Add(scope->key, LevelName(msg.level), scope->source,
                        absl::string_view(msg.payload.data(), msg.payload.size()), t);
  }
  void flush_() override {}
};

tally::v1::LogBatch NewBatch(const AttemptLogKey& key) {
  tally::v1::LogBatch b;
  b.set_job(key.job);
  b.set_attempt(key.attempt);
  b.set_rank(key.rank);
  return b;
}

}  // namespace

std::vector<tally::v1::LogBatch> BatchLines(const std::vector<CapturedLine>& lines,
                                            const std::map<AttemptLogKey, int64_t>& dropped) {
  std::vector<tally::v1::LogBatch> out;
  std::map<AttemptLogKey, int64_t> owed = dropped;
  std::optional<AttemptLogKey> key;
  int64_t bytes = 0;
  for (const CapturedLine& l : lines) {
    const int64_t size = static_cast<int64_t>(l.line.text().size());
    if (!key || !(*key == l.key) || out.back().lines_size() >= kMaxLogBatchLines ||
        bytes + size > kMaxLogBatchBytes) {
      out.push_back(NewBatch(l.key));
      key = l.key;
      bytes = 0;
      if (auto it = owed.find(l.key); it != owed.end()) {
        out.back().set_dropped_bytes(it->second);
        owed.erase(it);
      }
    }
    *out.back().add_lines() = l.line;
    bytes += size;
  }
  for (const auto& [k, n] : owed) {
    out.push_back(NewBatch(k));
    out.back().set_dropped_bytes(n);
  }
  return out;
}

void LogCapture::Add(const AttemptLogKey& key, absl::string_view level, absl::string_view source,
                     absl::string_view text, absl::Time time) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  absl::MutexLock lock(&mu_);
  for (absl::string_view part : absl::StrSplit(text, '\n')) {
    CapturedLine c;
    c.key = key;
    c.line.set_level(std::string(level));
    c.line.set_source(std::string(source));
    c.line.set_text(CapLogText(part));
    const absl::Duration since_epoch = time - absl::UnixEpoch();
    c.line.mutable_time()->set_seconds(absl::ToInt64Seconds(since_epoch));
    c.line.mutable_time()->set_nanos(static_cast<int32_t>(
        absl::ToInt64Nanoseconds(since_epoch - absl::Seconds(absl::ToInt64Seconds(since_epoch)))));
    bytes_ += static_cast<int64_t>(c.line.text().size());
    lines_.push_back(std::move(c));
  }
  while (bytes_ > max_bytes_ && !lines_.empty()) {
    const int64_t size = static_cast<int64_t>(lines_.front().line.text().size());
    dropped_[lines_.front().key] += size;
    bytes_ -= size;
    lines_.pop_front();
  }
}

std::vector<tally::v1::LogBatch> LogCapture::TakeBatches() {
  std::vector<CapturedLine> lines;
  std::map<AttemptLogKey, int64_t> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (lines_.empty() && dropped_.empty()) return {};
    lines.assign(std::make_move_iterator(lines_.begin()), std::make_move_iterator(lines_.end()));
    lines_.clear();
    bytes_ = 0;
    dropped.swap(dropped_);
  }
  return BatchLines(lines, dropped);
}

AttemptLogScope::AttemptLogScope(LogCapture* capture, AttemptLogKey key, std::string source) {
  current_scope = new ThreadScope{capture, std::move(key), std::move(source)};
}

AttemptLogScope::~AttemptLogScope() {
  delete current_scope;
  current_scope = nullptr;
}

void AttemptLogScope::set_source(std::string source) {
  if (current_scope != nullptr) current_scope->source = std::move(source);
}

void InstallAttemptLogSink() {
  static std::once_flag once;
  std::call_once(once, [] {
    spdlog::default_logger()->sinks().push_back(std::make_shared<AttemptLogSink>());
  });
}

}  // namespace tally::worker
