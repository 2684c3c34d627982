#include "worker/agent/outbox.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::worker {
namespace {

using tally::v1::WorkerMessage;
using ::testing::ElementsAre;

WorkerMessage Progress(int64_t step, const std::string& job = "jobs/1", int32_t attempt = 1) {
  WorkerMessage m;
  m.mutable_progress()->set_job(job);
  m.mutable_progress()->set_attempt(attempt);
  m.mutable_progress()->set_step(step);
  return m;
}

WorkerMessage Eval(int64_t step, const std::string& job = "jobs/1") {
  WorkerMessage m;
  m.mutable_eval()->set_job(job);
  m.mutable_eval()->set_attempt(1);
  m.mutable_eval()->set_step(step);
  return m;
}

WorkerMessage Checkpoint(int64_t step) {
  WorkerMessage m;
  m.mutable_checkpoint()->set_job("jobs/1");
  m.mutable_checkpoint()->set_attempt(1);
  m.mutable_checkpoint()->set_step(step);
  return m;
}

WorkerMessage Exit(int64_t step) {
  WorkerMessage m;
  m.mutable_exit()->set_job("jobs/1");
  m.mutable_exit()->set_attempt(1);
  m.mutable_exit()->set_step(step);
  m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
  return m;
}

// "progress jobs/1 7", "eval jobs/1 6", ...: the stream, in order.
std::vector<std::string> Stream(const Outbox& o) {
  std::vector<std::string> out;
  for (const WorkerMessage& m : o.messages()) {
    if (m.has_progress()) out.push_back(absl::StrCat("progress ", m.progress().job(), " ",
                                                     m.progress().step()));
    if (m.has_eval()) out.push_back(absl::StrCat("eval ", m.eval().job(), " ", m.eval().step()));
    if (m.has_checkpoint()) out.push_back(absl::StrCat("checkpoint ", m.checkpoint().step()));
    if (m.has_exit()) out.push_back(absl::StrCat("exit ", m.exit().step()));
    if (m.has_notice()) out.push_back(absl::StrCat("notice ", m.notice().cause()));
  }
  return out;
}

TEST(OutboxTest, NewerProgressReplacesTheQueuedOneWhenNothingFollowsIt) {
  Outbox o;
  o.Push(Progress(1));
  o.TakeNext(1);  // written: never replaced
  o.Push(Progress(2));
  o.Push(Progress(3));
  o.Push(Progress(4));
  EXPECT_THAT(Stream(o), ElementsAre("progress jobs/1 1", "progress jobs/1 4"));
}

TEST(OutboxTest, ProgressNeverOvertakesEvalsCheckpointsOrExits) {
  // While disconnected: step 6 is reported, evaluated and checkpointed,
  // then step 7 trains and the attempt stops keeping its state.
  Outbox o;
  o.Push(Progress(5));
  o.TakeNext(1);  // written before the connection dropped, not acknowledged
  o.Push(Progress(6));
  o.Push(Eval(6));
  o.Push(Checkpoint(6));
  o.Push(Progress(7));
  o.Push(Progress(8));
  o.Push(Eval(8));
  o.Push(Checkpoint(8));
  o.Push(Exit(8));
  // (The merge before this fix put steps 7 and 8 in place of step 6, ahead
  // of the evaluation and checkpoint of step 6: tallyd's step went 8, 6.)
  EXPECT_THAT(Stream(o),
              ElementsAre("progress jobs/1 5", "progress jobs/1 6", "eval jobs/1 6",
                          "checkpoint 6", "progress jobs/1 8", "eval jobs/1 8", "checkpoint 8",
                          "exit 8"));
  int64_t last = 0;
  for (const WorkerMessage& m : o.messages()) {
    const int64_t step = m.has_progress() ? m.progress().step()
                         : m.has_eval()   ? m.eval().step()
                         : m.has_checkpoint() ? m.checkpoint().step()
                                              : m.exit().step();
    EXPECT_GE(step, last);
    last = step;
  }
}

TEST(OutboxTest, ANewerStepNeverOvertakesAQueuedEvaluationOrCheckpoint) {
  // Queued while disconnected; the front is an older evaluation (it may be
  // on the wire), so every progress below could in principle be merged.
  Outbox o;
  o.Push(Eval(4));
  o.Push(Progress(5));
  o.Push(Eval(5));
  o.Push(Progress(6));
  o.Push(Checkpoint(6));
  o.Push(Progress(7));
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 4", "progress jobs/1 5", "eval jobs/1 5",
                                     "progress jobs/1 6", "checkpoint 6", "progress jobs/1 7"));
  // Adjacent progress merges: step 8 takes step 7's place, behind the
  // checkpoint of step 6, and step 7 is never sent.
  o.Push(Progress(8));
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 4", "progress jobs/1 5", "eval jobs/1 5",
                                     "progress jobs/1 6", "checkpoint 6", "progress jobs/1 8"));
  // Another job's report in between is no barrier for this job's merge.
  o.Push(Progress(1, "jobs/2"));
  o.Push(Progress(9));
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 4", "progress jobs/1 5", "eval jobs/1 5",
                                     "progress jobs/1 6", "checkpoint 6", "progress jobs/1 9",
                                     "progress jobs/2 1"));
}

TEST(OutboxTest, EvaluationsAndCheckpointsBetweenStepsKeepTheirPlaces) {
  // Step 5 evaluated, step 6 checkpointed, step 7 trained, all while
  // disconnected: no progress is adjacent to another, so nothing merges
  // and nothing moves.
  Outbox o;
  o.Push(Progress(5));
  o.Push(Eval(5));
  o.Push(Progress(6));
  o.Push(Checkpoint(6));
  o.Push(Progress(7));
  EXPECT_THAT(Stream(o), ElementsAre("progress jobs/1 5", "eval jobs/1 5", "progress jobs/1 6",
                                     "checkpoint 6", "progress jobs/1 7"));
  // Acknowledged up to the checkpoint: step 8 still takes step 7's place
  // only.
  for (uint64_t seq = 1; seq <= 3; ++seq) o.TakeNext(seq);
  o.Ack(3);
  o.Push(Progress(8));
  EXPECT_THAT(Stream(o), ElementsAre("checkpoint 6", "progress jobs/1 8"));
  // Once step 8 is written too, step 9 queues behind it; the checkpoint
  // stays until tallyd acknowledges it.
  o.TakeNext(4);
  o.TakeNext(5);
  o.Push(Progress(9));
  EXPECT_THAT(Stream(o), ElementsAre("checkpoint 6", "progress jobs/1 8", "progress jobs/1 9"));
  o.Ack(4);
  EXPECT_THAT(Stream(o), ElementsAre("progress jobs/1 8", "progress jobs/1 9"));
}

TEST(OutboxTest, OtherJobsDoNotBlockTheMergeAndAreNotMerged) {
  Outbox o;
  o.Push(Eval(0, "jobs/9"));
  o.Push(Progress(1));
  o.Push(Progress(1, "jobs/2"));
  o.Push(Eval(1, "jobs/2"));
  o.Push(Progress(2));       // replaces jobs/1's step 1: jobs/2's eval is no barrier
  o.Push(Progress(2, "jobs/2"));  // after jobs/2's eval: appended
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/9 0", "progress jobs/1 2", "progress jobs/2 1",
                                     "eval jobs/2 1", "progress jobs/2 2"));
}

TEST(OutboxTest, AnOlderProgressIsDroppedAndAnotherAttemptIsNotMerged) {
  Outbox o;
  o.Push(Eval(0));
  o.Push(Progress(5));
  o.Push(Progress(4));  // older than what is queued: dropped
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 0", "progress jobs/1 5"));
  o.Push(Progress(1, "jobs/1", 2));  // a new attempt resumed earlier: its own
  EXPECT_EQ(o.size(), 3u);
  EXPECT_EQ(o.messages().back().progress().attempt(), 2);
}

TEST(OutboxTest, ANoticeGoesAheadOfEverythingNotWritten) {
  WorkerMessage notice;
  notice.mutable_notice()->set_cause("sigterm");
  Outbox empty;
  empty.PushUrgent(notice);
  EXPECT_THAT(Stream(empty), ElementsAre("notice sigterm"));

  Outbox o;
  o.Push(Progress(5));
  o.TakeNext(1);  // written
  o.Push(Eval(5));
  o.Push(Progress(6));
  o.PushUrgent(notice);
  o.Push(Progress(7));  // still merges into step 6's place behind the notice
  EXPECT_THAT(Stream(o), ElementsAre("progress jobs/1 5", "notice sigterm", "eval jobs/1 5",
                                     "progress jobs/1 7"));

  // On a new connection the notice is sent first, with the time left.
  WorkerMessage later;
  later.mutable_notice()->set_cause("sigterm");
  later.mutable_notice()->set_deadline_seconds(3);
  o.Rewind();
  o.ReplaceNotice(later);
  EXPECT_THAT(Stream(o), ElementsAre("notice sigterm", "progress jobs/1 5", "eval jobs/1 5",
                                     "progress jobs/1 7"));
  EXPECT_EQ(o.front().notice().deadline_seconds(), 3);
}

TEST(OutboxTest, WhatTallydDidNotAcknowledgeIsWrittenAgainFirstOnTheNextStream) {
  Outbox o;
  o.Push(Eval(5));
  o.Push(Progress(6));
  o.Push(Checkpoint(6));
  EXPECT_EQ(o.TakeNext(1).seq(), 1u);
  EXPECT_EQ(o.TakeNext(2).seq(), 2u);
  o.Ack(1);  // the evaluation was taken; the stream broke after that
  EXPECT_THAT(Stream(o), ElementsAre("progress jobs/1 6", "checkpoint 6"));
  EXPECT_EQ(o.written(), 1u);

  o.Rewind();
  o.Push(Progress(7));  // the checkpoint of its job follows step 6: appended
  ASSERT_TRUE(o.HasUnwritten());
  // Renumbered on the new stream, in the old order.
  const WorkerMessage first = o.TakeNext(1);
  EXPECT_TRUE(first.has_progress());
  EXPECT_EQ(first.progress().step(), 6);
  EXPECT_EQ(first.seq(), 1u);
  EXPECT_TRUE(o.TakeNext(2).has_checkpoint());
  EXPECT_EQ(o.TakeNext(3).progress().step(), 7);
  EXPECT_FALSE(o.HasUnwritten());
  o.Ack(3);
  EXPECT_TRUE(o.empty());
}

TEST(OutboxTest, AnAcknowledgementNeverDropsWhatWasNotWritten) {
  Outbox o;
  o.Push(Eval(1));
  o.Push(Eval(2));
  o.TakeNext(1);
  o.Ack(9);  // a number past what was written (a confused or hostile peer)
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 2"));
  EXPECT_EQ(o.written(), 0u);
  o.Ack(9);
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 2"));
}

TEST(OutboxTest, WithATallydThatDoesNotAcknowledgeWrittenMessagesLeaveAtOnce) {
  Outbox o;
  o.Push(Eval(1));
  o.Push(Eval(2));
  EXPECT_EQ(o.TakeNext(0).seq(), 0u);
  o.DropWritten();
  EXPECT_THAT(Stream(o), ElementsAre("eval jobs/1 2"));
  o.Ack(0);  // numbered 0: never acknowledged
  EXPECT_EQ(o.size(), 1u);
}

}  // namespace
}  // namespace tally::worker
