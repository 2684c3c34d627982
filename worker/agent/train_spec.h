// JobSpec -> TrainConfig: the one place a protobuf spec becomes the trainer's
// plain config, for tally-worker and tally-train alike.
#ifndef TALLY_WORKER_AGENT_TRAIN_SPEC_H_
#define TALLY_WORKER_AGENT_TRAIN_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "tally/v1/spec.pb.h"
#include "worker/train/trainer.h"

namespace tally::worker {

struct DeviceOptions {
  std::string device = "cpu";   // "cpu" or "cuda:N"
  std::string checkpoint_dir;   // this job's directory
  double peak_flops = 0;
  // Data parallel: this process's rank of world_size (tallyd's assignment,
  // or tally-train's flags), where the ranks meet and the collectives'
  // settings; the spec adds expert_parallel.
  train::ParallelConfig parallel;
};

// Applies the spec's defaults and validation, then maps it. InvalidArgument,
// naming the spec field, for what this trainer cannot do (FP32 on CUDA:
// CUDA workers compute in BF16). BF16 on a CPU worker is BF16 autocast, as
// on CUDA; FP8 is emulated on CPU.
absl::StatusOr<train::TrainConfig> TrainConfigFromSpec(tally::v1::JobSpec spec,
                                                       const DeviceOptions& device);

// Dense BF16 peak FLOP/s of a GPU type, for MFU; 0 when unknown (e.g. cpu).
double PeakFlopsFor(const std::string& gpu_type);

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_TRAIN_SPEC_H_
