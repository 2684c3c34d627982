#include "server/api/watch_hub.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tally::api {

JobWatch::JobWatch(WatchHub* hub, int64_t job_id, int64_t after_sequence)
    : hub_(hub), job_id_(job_id), sent_(after_sequence), delivered_(after_sequence) {}

void JobWatch::Start() {
  // Register before reading the store: an event committed from here on is
  // either in the buffer or in what the store returns (or both: the sequence
  // numbers drop the repeats).
  if (!hub_->Register(shared_from_this())) {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  } else {
    // The job before its events: if it was terminal then, every event it will
    // ever have is already stored.
    absl::StatusOr<store::JobRecord> job = hub_->store()->GetJob(job_id_);
    absl::MutexLock lock(&mu_);
    if (!job.ok()) {
      end_status_ = job.status();
    } else if (store::IsTerminal(job->job().state())) {
      terminal_sequence_ = job->job().last_event_sequence();
    }
  }
  Pump(/*may_read=*/true);
}

void JobWatch::OnSent(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    sending_ = false;
    current_.reset();
    if (ok) {
      delivered_ = sent_;
    } else if (end_status_.ok()) {
      end_status_ = absl::CancelledError("the watch stream broke");
    }
  }
  Pump(/*may_read=*/true);
}

void JobWatch::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    if (end_status_.ok()) end_status_ = absl::CancelledError("the client cancelled the watch");
  }
  Pump(/*may_read=*/false);
}

void JobWatch::Revoke(absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    if (end_status_.ok()) end_status_ = std::move(why);
  }
  Pump(/*may_read=*/false);
}

void JobWatch::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  Pump(/*may_read=*/false);
}

void JobWatch::Deliver(
    const std::shared_ptr<const std::vector<tally::v1::JobEvent>>& events,
    const store::JobRecord& job) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    if (store::IsTerminal(job.job().state())) {
      terminal_sequence_ = job.job().last_event_sequence();
    }
    if (!buffer_stale_) {
      for (const tally::v1::JobEvent& e : *events) {
        if (e.sequence() > sent_) buffer_.emplace_back(events, &e);
      }
      // Only a watch that is busy can fall behind; one that is idle sends the
      // first of these at once.
      if ((sending_ || reading_) &&
          buffer_.size() > static_cast<size_t>(kMaxBufferedEvents)) {
        buffer_.clear();
        buffer_stale_ = true;
        catching_up_ = true;
      }
    }
  }
  Pump(/*may_read=*/false);
}

void JobWatch::Pump(bool may_read) {
  for (;;) {
    enum class Action { kSend, kRead, kEnd } action;
    absl::Status end;
    int64_t read_after = 0;
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || sending_ || reading_) return;
      if (!end_status_.ok()) {
        action = Action::kEnd;
        end = end_status_;
      } else if (shutting_down_) {
        action = Action::kEnd;
        end = absl::UnavailableError(absl::StrCat(
            "tallyd is shutting down; watch again with after_sequence=", delivered_));
      } else {
        std::shared_ptr<const tally::v1::JobEvent> next;
        if (!page_.empty()) {
          next = std::make_shared<const tally::v1::JobEvent>(std::move(page_.front()));
          page_.pop_front();
        } else if (catching_up_) {
          if (!may_read) return;  // whoever is sending or reading comes back here
          if (buffer_stale_) {
            buffer_.clear();
            buffer_stale_ = false;
          }
          action = Action::kRead;
          reading_ = true;
          read_after = sent_;
        } else {
          while (!buffer_.empty() && buffer_.front()->sequence() <= sent_) {
            buffer_.pop_front();
          }
          if (!buffer_.empty()) {
            if (buffer_.front()->sequence() != sent_ + 1) {
              // Cannot happen while commits are notified in order; re-read
              // the store rather than skip an event, or (where this thread
              // may not read) end the watch with where to resume.
              buffer_.clear();
              buffer_stale_ = true;
              catching_up_ = true;
              if (!may_read) {
                end_status_ = absl::AbortedError(absl::StrCat(
                    "the watch missed an event; watch again with after_sequence=",
                    delivered_));
              }
              continue;
            } else {
              next = std::move(buffer_.front());
              buffer_.pop_front();
            }
          } else if (terminal_sequence_ >= 0 && sent_ >= terminal_sequence_) {
            action = Action::kEnd;
            end = absl::OkStatus();
          } else {
            return;  // idle until the next commit
          }
        }
        if (next != nullptr) {
          if (next->sequence() <= sent_) continue;
          current_ = std::move(next);
          sent_ = current_->sequence();
          sending_ = true;
          action = Action::kSend;
        }
      }
      if (action == Action::kEnd) ended_ = true;
    }
    switch (action) {
      case Action::kSend:
        StartSend(current_.get());
        return;
      case Action::kEnd:
        hub_->Unregister(this);
        End(std::move(end));  // may destroy this
        return;
      case Action::kRead: {
        absl::StatusOr<std::vector<tally::v1::JobEvent>> events =
            hub_->store()->ListEvents(job_id_, read_after, kCatchUpPage);
        absl::MutexLock lock(&mu_);
        reading_ = false;
        if (!events.ok()) {
          if (end_status_.ok()) end_status_ = events.status();
        } else if (events->empty()) {
          catching_up_ = false;  // the buffer holds everything after sent_
        } else {
          page_.assign(std::make_move_iterator(events->begin()),
                       std::make_move_iterator(events->end()));
        }
        break;
      }
    }
  }
}

bool WatchHub::Register(const std::shared_ptr<JobWatch>& watch) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return false;
  auto [it, inserted] = watches_[watch->job_id()].emplace(watch.get(), watch);
  if (inserted) ++num_watches_;
  return true;
}

void WatchHub::Unregister(const JobWatch* watch) {
  std::shared_ptr<JobWatch> last;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto job = watches_.find(watch->job_id());
  if (job == watches_.end()) return;
  auto it = job->second.find(watch);
  if (it == job->second.end()) return;
  last = std::move(it->second);
  job->second.erase(it);
  if (job->second.empty()) watches_.erase(job);
  --num_watches_;
}

void WatchHub::OnJobCommitted(const store::JobRecord& job,
                              const store::Mutation& mutation) {
  std::vector<std::shared_ptr<JobWatch>> targets;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(job.id());
    if (it == watches_.end()) return;
    targets.reserve(it->second.size());
    for (const auto& [ptr, watch] : it->second) targets.push_back(watch);
  }
  // One copy of the events, shared by every watch of the job.
  auto events = std::make_shared<const std::vector<tally::v1::JobEvent>>(mutation.events);
  for (const auto& w : targets) w->Deliver(events, job);
}

void WatchHub::Shutdown() {
  std::vector<std::shared_ptr<JobWatch>> all;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (const auto& [job, watches] : watches_) {
      for (const auto& [ptr, watch] : watches) all.push_back(watch);
    }
  }
  for (const auto& w : all) w->Shutdown();
}

int64_t WatchHub::num_watches() const {
  absl::MutexLock lock(&mu_);
  return num_watches_;
}

}  // namespace tally::api
