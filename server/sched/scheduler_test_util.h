// What the scheduler's tests share: a tiny valid job spec and a channel that
// records what is sent to workers.
#ifndef TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_
#define TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler.h"
#include "tally/v1/spec.pb.h"

namespace tally::sched {

// A spec that validates: one layer, 1000 steps, `gpus` x cpu.
inline tally::v1::JobSpec TinySpec(int gpus = 1) {
  tally::v1::JobSpec s;
  s.mutable_model()->set_num_layers(1);
  s.mutable_model()->set_d_model(16);
  s.mutable_model()->set_num_heads(2);
  s.mutable_data()->set_train_path("/data/x");
  s.mutable_data()->set_seq_len(64);
  s.mutable_training()->set_max_steps(1000);
  s.mutable_resources()->set_gpu_type("cpu");
  s.mutable_resources()->set_gpu_count(gpus);
  return s;
}

// Where a worker with checkpoint root /ckpt writes `job`'s ("jobs/7")
// checkpoint of `step`.
inline std::string CheckpointPath(const std::string& job, int64_t step) {
  return absl::StrFormat("/ckpt/%s/step-%08d.ckpt", absl::StrReplaceAll(job, {{"s/", "-"}}),
                         step);
}

// Every series as "name,label=value,..." -> value (histograms: the count).
inline std::map<std::string, double> MetricValues(const metrics::Registry& registry) {
  std::map<std::string, double> values;
  for (const auto& f : registry.Collect()) {
    for (const auto& m : f.metric) {
      std::string key = f.name;
      for (const auto& [k, v] : m.labels) key += "," + k + "=" + v;
      values[key] = f.type == metrics::MetricType::kHistogram ? m.sample_count : m.value;
    }
  }
  return values;
}

// The one WorkerChannel of the scheduler's tests: records every message
// sent, as "worker message-in-text-format" in order (sent), by worker (Take),
// and the stop orders and assignments as messages.
class RecordingChannel : public WorkerChannel {
 public:
  void Send(const std::string& worker_id, const tally::v1::ControllerMessage& m) override {
    sent.push_back(worker_id + " " + m.ShortDebugString());
    by_worker_[worker_id].push_back(m);
    if (m.has_stop()) {
      stops.push_back(m.stop());
      stop_workers.push_back(worker_id);
    }
    if (m.has_assignment()) assignments.emplace_back(worker_id, m.assignment());
  }
  // Removes and returns the messages of `kind` sent to `worker_id`, in order.
  std::vector<tally::v1::ControllerMessage> Take(const std::string& worker_id,
                                                 tally::v1::ControllerMessage::MsgCase kind) {
    std::vector<tally::v1::ControllerMessage> out, rest;
    for (auto& m : by_worker_[worker_id]) (m.msg_case() == kind ? out : rest).push_back(m);
    by_worker_[worker_id] = rest;
    return out;
  }
  // Stop orders that asked for a final checkpoint.
  int checkpoint_stops() const {
    int n = 0;
    for (const auto& s : stops) n += s.checkpoint();
    return n;
  }

  std::vector<std::string> sent;
  std::vector<tally::v1::StopOrder> stops;
  std::vector<std::string> stop_workers;  // stops[i] went to stop_workers[i]
  std::vector<std::pair<std::string, tally::v1::Assignment>> assignments;

 private:
  std::map<std::string, std::vector<tally::v1::ControllerMessage>> by_worker_;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_
