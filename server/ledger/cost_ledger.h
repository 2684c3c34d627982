// CostLedger: everything tallyd knows about money. It owns the price table and
// the throughput measured from finished jobs, and computes values: a job's
// cost accrued to a time, a checkpoint's price, whether a job is over its
// budget, what a spec would cost. It writes nothing, holds no job state and
// does no I/O: the scheduler puts the values it returns into a plan, and they
// reach the store (and the dollar counters) only when that plan commits.
//
// Pricing: a running attempt accrues gpu_count x the price of the job's GPU
// type for every second of tallyd's clock from cost.accrued_until; queued
// time costs nothing.
//
// Thread-safety: not thread-safe; the scheduler serialises calls.
#ifndef TALLY_SERVER_LEDGER_COST_LEDGER_H_
#define TALLY_SERVER_LEDGER_COST_LEDGER_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally::ledger {

// Prices ($ per GPU-hour) and, for estimates, the FLOP/s one GPU achieves,
// by GPU type. A GPU type with no price costs 0.
struct PriceTable {
  std::map<std::string, double> usd_per_gpu_hour;
  std::map<std::string, double> flops_per_second_per_gpu;
  double Price(const std::string& gpu_type) const;  // 0 when unpriced
  std::string Describe() const;                     // one line for the log
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
  // `now` added (when `running`; else only accrued_until moves to `now`).
  // A time before accrued_until adds nothing.
  Accrual Accrue(const tally::v1::Job& job, bool running, absl::Time now) const;

  // The cost after an attempt ends without keeping its work: its spend since
  // the last checkpoint moves to lost_usd. `added_usd` is the lost amount.
  Accrual ChargeLost(const tally::v1::CostStatus& cost) const;

  // `checkpoint` priced at the job's (accrued) cost against the previous
  // checkpoint, or against the step-0 baseline for the first.
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
  // throughput (for estimates).
  void RecordFinished(const tally::v1::Job& job);

  // Prices a spec (defaults applied and validated by the caller) at the
  // current prices and the GPU type's throughput: measured from finished
  // jobs when there are any, else configured.
  tally::v1::CostEstimate Estimate(const tally::v1::JobSpec& spec) const;

  // Training FLOPs per token of a spec's model.
  static double FlopsPerToken(const tally::v1::JobSpec& spec);

 private:
  struct Throughput {
    double flops = 0;
    double gpu_seconds = 0;
    int jobs = 0;
  };
  PriceTable prices_;
  std::map<std::string, Throughput> throughput_;
};

}  // namespace tally::ledger

#endif  // TALLY_SERVER_LEDGER_COST_LEDGER_H_
