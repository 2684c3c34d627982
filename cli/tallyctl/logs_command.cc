#include "cli/tallyctl/logs_command.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/tallyctl/exit_codes.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/output.h"
#include "cli/tallyctl/watch_reconnect.h"
#include "google/protobuf/util/time_util.h"

ABSL_FLAG(bool, follow, false, "logs: keep printing new lines until the job ends");
ABSL_FLAG(int, attempt, 0, "logs: only this attempt's lines (0: every attempt)");
ABSL_FLAG(int, rank, -1, "logs: only this rank's lines (-1: every rank)");
ABSL_FLAG(absl::Duration, since, absl::ZeroDuration(),
          "logs: only lines of this last stretch of time, e.g. 10m (0: all)");
ABSL_FLAG(int, tail, 0, "logs: only the last N lines (0: all); with --follow, then new ones");

namespace tally::cli {
namespace {

constexpr int kMaxTail = 5000;

std::string JobName(const std::string& arg) {
  return absl::StartsWith(arg, "jobs/") ? arg : absl::StrCat("jobs/", arg);
}

// The selector of the flags, or kUsage after saying which flag is wrong.
int Selector(tally::v1::LogSelector* s) {
  const int attempt = absl::GetFlag(FLAGS_attempt), rank = absl::GetFlag(FLAGS_rank),
            tail = absl::GetFlag(FLAGS_tail);
  const absl::Duration since = absl::GetFlag(FLAGS_since);
  if (attempt < 0) {
    std::cerr << "tallyctl logs: --attempt: an attempt number, 1 or more (0: every attempt)\n";
    return kUsage;
  }
  if (rank < -1 || rank > 65535) {
    std::cerr << "tallyctl logs: --rank: 0-65535 (-1: every rank)\n";
    return kUsage;
  }
  if (tail < 0 || tail > kMaxTail) {
    std::cerr << "tallyctl logs: --tail: 0-" << kMaxTail << " lines (0: every line)\n";
    return kUsage;
  }
  if (since < absl::ZeroDuration()) {
    std::cerr << "tallyctl logs: --since: a duration back from now, e.g. 10m or 2h\n";
    return kUsage;
  }
  s->set_attempt(attempt);
  if (rank >= 0) s->set_rank(rank);
  s->set_tail(tail);
  s->set_after_sequence(absl::GetFlag(FLAGS_after));
  if (since > absl::ZeroDuration()) {
    *s->mutable_since() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(
        absl::ToUnixMicros(absl::Now() - since));
  }
  return kOk;
}

void Print(const tally::v1::LogLine& l) {
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonLine(l) << "\n";
  } else {
    std::cout << LogLineText(l, absl::LocalTimeZone()) << "\n";
  }
}

int Page(Client& c, const std::string& name, tally::v1::LogSelector selector) {
  while (true) {
    tally::v1::GetJobLogsRequest req;
    req.set_name(name);
    *req.mutable_selector() = selector;
    tally::v1::GetJobLogsResponse resp;
    grpc::Status s = c.Call(
        [&](grpc::ClientContext* ctx) { return c.stub()->GetJobLogs(ctx, req, &resp); });
    if (!s.ok()) return Fail(s, c);
    for (const auto& l : resp.lines()) Print(l);
    std::cout << std::flush;
    if (!resp.more() || resp.lines_size() == 0) return kOk;
    selector.set_tail(0);
    selector.set_after_sequence(resp.lines(resp.lines_size() - 1).sequence());
  }
}

int Follow(Client& c, const std::string& name, tally::v1::LogSelector selector) {
  Retry retry{.limit = 5};  // a mistyped --controller fails in seconds
  bool established = false;
  while (true) {
    tally::v1::WatchJobLogsRequest req;
    req.set_name(name);
    *req.mutable_selector() = selector;
    grpc::ClientContext ctx;
    c.Authorize(&ctx);
    auto reader = c.stub()->WatchJobLogs(&ctx, req);
    tally::v1::LogLine l;
    while (reader->Read(&l)) {
      if (!established) retry = Retry();  // a watch under way waits longer
      established = true;
      retry.Reset();
      Print(l);
      std::cout << std::flush;
      // Resume after the last line, with no tail: it was printed.
      selector.set_tail(0);
      selector.set_after_sequence(l.sequence());
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) return kOk;
    if (!retry.Again(s)) return Fail(s, c);
    if (retry.failures == 1) {
      std::cerr << "tallyctl logs: waiting for tallyd at " << Safe(c.Addresses()) << " ("
                << Safe(c.Redact(s.error_message())) << ")\n";
    }
    retry.Wait();
  }
}

}  // namespace

std::string LogLineText(const tally::v1::LogLine& l, absl::TimeZone tz) {
  const absl::Time t = absl::FromUnixMicros(
      google::protobuf::util::TimeUtil::TimestampToMicroseconds(l.time()));
  std::string out = absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%E3S", t, tz), " a",
                                 l.attempt(), " r", l.rank(), " ",
                                 absl::StrFormat("%-7s", Safe(l.level())), " ");
  if (l.source() != "trainer") absl::StrAppend(&out, "[", Safe(l.source()), "] ");
  absl::StrAppend(&out, Safe(l.text()));
  return out;
}

int Logs(Client& c, const std::string& job) {
  tally::v1::LogSelector selector;
  if (int rc = Selector(&selector); rc != kOk) return rc;
  const std::string name = JobName(job);
  return absl::GetFlag(FLAGS_follow) ? Follow(c, name, selector) : Page(c, name, selector);
}

}  // namespace tally::cli
