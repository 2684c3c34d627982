#include "server/store/write_health.h"

#include "absl/strings/str_cat.h"

namespace tally::store {

bool WriteHealth::IsStoreFailure(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnavailable:
      return true;
    default:
      return false;
  }
}

void WriteHealth::Record(const absl::Status& s) {
  if (!s.ok() && !IsStoreFailure(s)) return;
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    failing_.reset();
  } else {
    failing_ = absl::StrCat("the store refuses writes: ", s.message());
  }
}

std::optional<std::string> WriteHealth::Failing() const {
  absl::MutexLock lock(&mu_);
  return failing_;
}

}  // namespace tally::store
