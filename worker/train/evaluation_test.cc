// The evaluation sample stands for the whole validation split: on a trained
// model, the loss over a 25% sample of whole documents is within 2% of the
// loss over the whole split, on corpora with different length distributions;
// the document-weighted loss averages each document's mean.
#include <ATen/Parallel.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/eval_sample.h"
#include "worker/data/test_fortunes.h"
#include "worker/data/tokenizer.h"
#include "worker/train/trainer.h"

namespace tally::train {
namespace {

class Evals : public TrainEvents {
 public:
  void OnStart(const RunInfo& i) override { info = i; }
  void OnEval(const EvalMetrics& e) override { evals.push_back(e); }
  RunInfo info;
  std::vector<EvalMetrics> evals;
};

// Fortunes (byte-tokenized) from /usr/share/games/fortunes/FILE, one
// document each.
std::vector<std::vector<uint16_t>> Fortunes(const std::vector<std::string>& files) {
  std::vector<std::vector<uint16_t>> docs;
  for (const auto& f : files) {
    absl::Status s = data::ReadCorpusFile(
        "/usr/share/games/fortunes/" + f, {},
        [&](absl::string_view text, const data::DocumentSource&) {
          docs.emplace_back();
          data::ByteTokenizer::Encode(text, &docs.back());
          return absl::OkStatus();
        });
    EXPECT_TRUE(s.ok()) << s;
  }
  return docs;
}

// The same text regrouped into a long-tailed split: most documents one to
// three fortunes, a few of dozens or hundreds, one of them ~20% of the
// tokens (the shape that made the old, longest-first sample misleading).
std::vector<std::vector<uint16_t>> LongTailed(const std::vector<std::vector<uint16_t>>& fortunes,
                                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<int> small(0.5);
  std::vector<std::vector<uint16_t>> docs;
  size_t next = 0;
  const size_t fifth = fortunes.size() / 5;
  int k = 0;
  while (next < fortunes.size()) {
    size_t n = 1 + static_cast<size_t>(small(rng));
    if (k == 7) n = fifth;                      // one document of ~20%
    if (k % 40 == 13) n = 30 + rng() % 40;      // a few long ones
    docs.emplace_back();
    for (size_t i = 0; i < n && next < fortunes.size(); ++i, ++next) {
      docs.back().insert(docs.back().end(), fortunes[next].begin(), fortunes[next].end());
    }
    ++k;
  }
  return docs;
}

void Write(const std::string& prefix, const std::vector<std::vector<uint16_t>>& docs) {
  auto w = data::DatasetWriter::Create(prefix);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const auto& d : docs) ASSERT_TRUE((*w)->Add(d).ok());
  ASSERT_TRUE((*w)->Finish("").ok());
}

class EvaluationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    char dir[] = "/tmp/tally_evaluation_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string dir_;

  static TrainConfig Config(const std::string& corpus) {
    TrainConfig c;
    c.model.num_layers = 2;
    c.model.d_model = 32;
    c.model.num_heads = 2;
    c.data.train_path = dir_ + "/" + corpus + "/train";
    c.data.seq_len = 128;
    c.micro_batch_rows = 8;
    c.global_batch_tokens = 2048;
    c.max_steps = 60;
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = 5;
    c.eval_interval_steps = 60;  // at step 0 and at the end
    c.seed = 1;
    return c;
  }

  // The trained model's final evaluation with `eval_tokens` (the training
  // is the same whatever the evaluation takes).
  static EvalMetrics FinalEval(const std::string& corpus, int64_t eval_tokens, RunInfo* info) {
    TrainConfig c = Config(corpus);
    c.eval_tokens = eval_tokens;
    Evals e;
    const TrainResult r = Train(c, &e, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
    if (info) *info = e.info;
    return e.evals.empty() ? EvalMetrics{} : e.evals.back();
  }

  static void ExpectQuarterStandsForTheWhole(const std::string& corpus) {
    auto val = data::Dataset::Open(dir_ + "/" + corpus + "/val", 0);
    ASSERT_TRUE(val.ok()) << val.status();
    int64_t split_tokens = 0;
    for (int64_t l : (*val)->DocLengths()) split_tokens += l;
    RunInfo whole_info, quarter_info;
    const EvalMetrics whole = FinalEval(corpus, 0, &whole_info);
    const EvalMetrics quarter = FinalEval(corpus, split_tokens / 4, &quarter_info);
    ASSERT_EQ(whole.step, 60);
    ASSERT_EQ(quarter.step, 60);
    EXPECT_EQ(whole.docs, (*val)->num_docs());
    EXPECT_LT(quarter.docs, whole.docs / 2);
    EXPECT_LT(quarter.target_tokens, whole.target_tokens / 2);
    EXPECT_NEAR(quarter.val_loss, whole.val_loss, 0.02 * whole.val_loss)
        << corpus << ": " << quarter_info.eval_coverage;
    // Trained: well under the byte-uniform ln(258) = 5.55.
    EXPECT_LT(whole.val_loss, 3.5);
    EXPECT_NE(whole_info.eval_coverage.find("(100.0% of the split)"), std::string::npos)
        << whole_info.eval_coverage;
    EXPECT_NE(quarter_info.eval_coverage.find(absl::StrCat(" of ", (*val)->num_docs(),
                                                           " documents")),
              std::string::npos)
        << quarter_info.eval_coverage;
    std::cout << corpus << ": whole split " << whole.val_loss << " (document-weighted "
              << whole.doc_val_loss << "), " << quarter_info.eval_coverage << ": "
              << quarter.val_loss << " (document-weighted " << quarter.doc_val_loss << ")\n";
  }
};

std::string EvaluationTest::dir_;

TEST_F(EvaluationTest, AQuarterOfShortDocumentsStandsForTheWholeSplit) {
  const std::string d = dir_ + "/short";
  ::mkdir(d.c_str(), 0755);
  data::WriteFortunes(d + "/train", {"fortunes.u8", "science.u8", "literature.u8"});
  data::WriteFortunes(d + "/val", {"people.u8", "work.u8"});
  ExpectQuarterStandsForTheWhole("short");
}

TEST_F(EvaluationTest, AQuarterOfALongTailedSplitStandsForTheWholeSplit) {
  const std::string d = dir_ + "/long";
  ::mkdir(d.c_str(), 0755);
  data::WriteFortunes(d + "/train", {"fortunes.u8", "science.u8", "literature.u8"});
  Write(d + "/val", LongTailed(Fortunes({"people.u8", "work.u8", "pets.u8"}), 5));
  ExpectQuarterStandsForTheWhole("long");
}

TEST_F(EvaluationTest, TheDocumentWeightedLossAveragesEachDocumentsMean) {
  // Two documents whose means differ: one long, one short. The
  // token-weighted loss leans to the long one; the document-weighted one is
  // the plain mean of the two documents' means, which a third evaluation of
  // each document alone gives.
  const std::string d = dir_ + "/two";
  ::mkdir(d.c_str(), 0755);
  data::WriteFortunes(d + "/train", {"fortunes.u8", "science.u8"});
  const auto fortunes = Fortunes({"people.u8"});
  std::vector<uint16_t> long_doc, short_doc = fortunes[0];
  for (size_t i = 1; i < 40 && i < fortunes.size(); ++i) {
    long_doc.insert(long_doc.end(), fortunes[i].begin(), fortunes[i].end());
  }
  Write(d + "/val", {long_doc, short_doc});
  TrainConfig c = Config("two");
  c.max_steps = 10;
  c.eval_interval_steps = 10;
  Evals both;
  ASSERT_EQ(Train(c, &both, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  const EvalMetrics e = both.evals.back();
  EXPECT_EQ(e.docs, 2);
  // Each document alone, as a split of its own.
  double means = 0;
  for (const auto& [name, doc] : {std::pair{"long", long_doc}, std::pair{"short", short_doc}}) {
    Write(d + "/val_" + name, {doc});
    TrainConfig one = c;
    one.data.val_path = d + "/val_" + name;
    Evals alone;
    ASSERT_EQ(Train(one, &alone, nullptr).outcome, TrainResult::Outcome::kSucceeded);
    EXPECT_NEAR(alone.evals.back().doc_val_loss, alone.evals.back().val_loss, 1e-5);
    means += alone.evals.back().val_loss;
  }
  EXPECT_NEAR(e.doc_val_loss, means / 2, 1e-4);
  EXPECT_GT(std::abs(e.doc_val_loss - e.val_loss), 1e-3);
}

}  // namespace
}  // namespace tally::train
