// What the scheduler's tests share: a tiny valid job spec and a channel that
// records what is sent to workers.
#ifndef TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_
#define TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_

#include <map>
#include <string>
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

// Every message sent, as "worker message-in-text-format", in order.
class RecordingChannel : public WorkerChannel {
 public:
  void Send(const std::string& worker_id, const tally::v1::ControllerMessage& m) override {
    sent.push_back(worker_id + " " + m.ShortDebugString());
  }
  std::vector<std::string> sent;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHEDULER_TEST_UTIL_H_
