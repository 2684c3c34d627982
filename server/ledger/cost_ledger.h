// CostLedger: everything tallyd knows about money. It owns the price table and
// the throughput measured from finished jobs, and computes values: a job's
// cost accrued to a time, a checkpoint's price, whether a job is over its
// budget, what a spec would cost. It writes nothing, holds no job state and
// does no I/O: the scheduler puts the values it returns into a plan, and they
// reach the store (and the dollar counters) only when that plan commits.
//
// Pricing: a running attempt accrues its GPUs (cost.attempt_gpus, else the
// spec's gpu_count) x its per-GPU price for every second of tallyd's clock
// from cost.accrued_until; queued time costs nothing.
// The per-GPU price blends the GPU type's on-demand and spot prices by how
// many of the attempt's GPUs run on spot workers (cost.spot_gpus, set by the
// scheduler when the attempt starts): see PriceTable::PriceFor.
//
// Preemption: an attempt ended by a preemption keeps its work up to its last
// checkpoint; what it spent after that is work the next attempt redoes and
// moves to cost.redone_usd (ChargeRedone), which is not lost_usd (the spend
// failures threw away). When the notice checkpoint landed nothing is redone.
//
// Spot estimate (Estimate's spot_* fields), per GPU type T of the spec:
//   spot price        p_s = SpotPrice(T); on-demand p = Price(T)
//   rate              r   = notice preemptions / spot GPU-hours, summed over
//                           finished T jobs that ran on spot (0 when none has)
//   expected          n   = r x gpu_hours
//   redone per preemption, in GPU-hours:
//     measured: h x gpus, where h is the mean redone wall-clock hours per
//       preemption of those finished jobs (each job's redone_usd over its
//       own mean $/GPU-hour, cost_usd / GPU-hours, gives its redone
//       GPU-hours; over its GPU count, wall-clock hours), summed over the jobs
//       with a known price and divided by their preemptions (all causes:
//       redone_usd covers all);
//     else (none of them was preempted with a known price): half a checkpoint interval of
//       the run, 0.5 x interval / max_steps x gpu_hours (interval 0, or past
//       max_steps: max_steps), a pessimistic bound that assumes the notice
//       checkpoint never lands.
//   spot_redone_usd   = n x redone GPU-hours per preemption x p_s
//   spot_cost_usd     = p_s x gpu_hours + spot_redone_usd
//   spot_savings_usd  = cost_usd - spot_cost_usd (negative: spot costs more)
// To first order: the redone hours' own preemptions are not counted. Every
// field is finite; with no prices configured every dollar field is 0.
//
// Thread-safety: not thread-safe; the scheduler serialises calls.
#ifndef TALLY_SERVER_LEDGER_COST_LEDGER_H_
#define TALLY_SERVER_LEDGER_COST_LEDGER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally::ledger {

// Prices ($ per GPU-hour, on-demand and spot) and, for estimates, the FLOP/s
// one GPU achieves, by GPU type. A GPU type with no price costs 0; one with
// no spot price is priced on spot at its on-demand price.
struct PriceTable {
  std::map<std::string, double> usd_per_gpu_hour;
  std::map<std::string, double> spot_usd_per_gpu_hour;
  std::map<std::string, double> flops_per_second_per_gpu;
  // GPU types workers may announce besides those the tables above name
  // (tallyd's config: worker_gpu_types).
  std::vector<std::string> worker_gpu_types;
  // Every type the tables and worker_gpu_types name, sorted; empty when
  // nothing is configured.
  std::vector<std::string> KnownGpuTypes() const;
  double Price(const std::string& gpu_type) const;  // 0 when unpriced
  // The configured spot price; Price(gpu_type) when there is none.
  double SpotPrice(const std::string& gpu_type) const;
  // The per-GPU price of an attempt on `gpus` GPUs (< 1 counts as 1), of
  // which `spot_gpus` (clamped to 0..gpus) run on spot:
  //   ((gpus - spot_gpus) x Price + spot_gpus x SpotPrice) / gpus.
  double PriceFor(const std::string& gpu_type, int gpus, int spot_gpus) const;
  std::string Describe() const;  // one line for the log
};

// A job's cost after accruing to some time, and what that added.
struct Accrual {
  tally::v1::CostStatus cost;
  double added_usd = 0;
};

// Why a job must stop on its budget.
struct BudgetStop {
  std::string reason;  // "budget: spent $X of max_dollars $Y"
  std::string detail;  // GPU-seconds and price
};

class CostLedger {
 public:
  explicit CostLedger(PriceTable prices = {});

  // Replaces the prices. Accrue what ran so far at the old prices first.
  void SetPrices(PriceTable prices);
  const PriceTable& prices() const { return prices_; }

  // `job`'s cost with its running attempt's time from cost.accrued_until to
  // `now` added (when `running`; else only accrued_until moves to `now`) at
  // PriceFor(gpu_type, GPUs, cost.spot_gpus), which also becomes
  // cost.usd_per_gpu_hour; its spot GPUs' time joins cost.spot_gpu_seconds.
  // A time before accrued_until adds nothing.
  Accrual Accrue(const tally::v1::Job& job, bool running, absl::Time now) const;

  // The cost after an attempt ends without keeping its work: its spend since
  // the last checkpoint moves to lost_usd. `added_usd` is the lost amount.
  Accrual ChargeLost(const tally::v1::CostStatus& cost) const;

  // The cost after an attempt ends by a preemption. `checkpoint_at_exit`: its
  // latest recorded checkpoint is of the step it stopped at (the notice
  // checkpoint landed), so nothing is redone and `added_usd` is 0. Otherwise
  // its spend since the last checkpoint moves to redone_usd (not lost_usd)
  // and `added_usd` is that amount. Either way the attempt's spend since its
  // checkpoint restarts at 0.
  Accrual ChargeRedone(const tally::v1::CostStatus& cost, bool checkpoint_at_exit) const;

  // `checkpoint` priced at the job's (accrued) cost against the previous
  // checkpoint, or against the step-0 baseline for the first. The gain per
  // dollar is of the job's early_stopping.metric: with quantized_val_loss,
  // the checkpoints' quantized losses (policy/loss_metric.h).
  tally::v1::Checkpoint PriceCheckpoint(const tally::v1::Job& job,
                                        tally::v1::Checkpoint checkpoint,
                                        const std::optional<tally::v1::Checkpoint>& previous) const;

  // Set when a running job's (accrued) cost has reached budget.max_dollars;
  // `cost` in place of the job's own (a view accrued to now).
  std::optional<BudgetStop> CheckBudget(const tally::v1::Job& job) const {
    return CheckBudget(job, job.cost());
  }
  std::optional<BudgetStop> CheckBudget(const tally::v1::Job& job,
                                        const tally::v1::CostStatus& cost) const;

  // A finished job's tokens and GPU-seconds join its GPU type's measured
  // throughput (for estimates); when it ran on spot (spot_gpu_seconds > 0),
  // even with no tokens, its notice preemptions, spot GPU-seconds and redone
  // work join the type's measured preemption rate. Notices of a job that
  // never ran on spot came from on-demand workers and are not counted.
  void RecordFinished(const tally::v1::Job& job);

  // Prices a spec (defaults applied and validated by the caller) at the
  // current prices and the GPU type's throughput: measured from finished
  // jobs when there are any, else configured. The spot_* fields price the
  // same run on spot capacity (see the top of this file).
  tally::v1::CostEstimate Estimate(const tally::v1::JobSpec& spec) const;

  // Training FLOPs per token of a spec's model.
  static double FlopsPerToken(const tally::v1::JobSpec& spec);
  // A distillation teacher's forward FLOPs per token (a third of its
  // training FLOPs), from the shape training.distill.teacher.model states;
  // 0 without a teacher or a stated shape. Included in FlopsPerToken.
  static double TeacherFlopsPerToken(const tally::v1::JobSpec& spec);

 private:
  // Estimate's spot_* fields, from out's gpu_hours and cost_usd.
  void FillSpotEstimate(const tally::v1::JobSpec& spec, tally::v1::CostEstimate* out) const;

  struct Throughput {
    double flops = 0;
    double gpu_seconds = 0;
    int jobs = 0;
  };
  // Finished jobs of a GPU type that ran on spot.
  struct Preemptions {
    int jobs = 0;
    double notices = 0;           // by_notice, summed
    double spot_gpu_seconds = 0;
    // Jobs whose redone work converts to hours (a known price): preemptions
    // of all causes and the wall-clock hours they redid.
    double priced_preemptions = 0;
    double redone_hours = 0;
  };
  PriceTable prices_;
  std::map<std::string, Throughput> throughput_;
  std::map<std::string, Preemptions> preemptions_;
};

}  // namespace tally::ledger

#endif  // TALLY_SERVER_LEDGER_COST_LEDGER_H_
