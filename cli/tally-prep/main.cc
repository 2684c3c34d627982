// tally-prep: turns text or JSONL corpora into the tokenized, memory-mapped
// dataset the trainer reads: OUT/train.{bin,idx,json} and OUT/val.{...}, split
// by document, deterministically (a hash of the document's text and --seed).
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"

ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(std::string, format, "text", "input format: text or jsonl");
ABSL_FLAG(std::string, split, "separator",
          "how text files divide into documents: separator (a line equal to "
          "--separator, as in fortune files), blank (blank lines) or file (one "
          "document per file)");
ABSL_FLAG(std::string, separator, "%", "document separator line for --split=separator");
ABSL_FLAG(std::string, field, "text", "JSONL field holding the document text");
ABSL_FLAG(double, val_fraction, 0.05, "fraction of documents held out for validation");
ABSL_FLAG(uint64_t, seed, 0, "changes which documents are held out");

namespace {

uint64_t Fnv1a(absl::string_view s, uint64_t seed) {
  uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL);
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

int Fail(const std::string& message, int code = 1) {
  std::cerr << "tally-prep: " << message << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-prep: tokenize corpora into a tally dataset.\n\nUsage: tally-prep "
      "--out=DIR [--format=text|jsonl] [--split=separator|blank|file] FILE...\n"
      "Writes DIR/train.{bin,idx,json} and DIR/val.{bin,idx,json}; a job spec "
      "names DIR/train as data.train_path.");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> inputs(args.begin() + 1, args.end());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail("--out is required: the dataset directory to write", 2);
  if (inputs.empty()) return Fail("no input files: give one or more corpus files", 2);
  tally::data::CorpusOptions options;
  const std::string format = absl::GetFlag(FLAGS_format);
  const std::string split = absl::GetFlag(FLAGS_split);
  if (format == "jsonl") {
    options.format = tally::data::CorpusFormat::kJsonl;
    options.field = absl::GetFlag(FLAGS_field);
  } else if (format != "text") {
    return Fail("--format: must be text or jsonl, got \"" + format + "\"", 2);
  } else if (split == "separator") {
    options.format = tally::data::CorpusFormat::kTextSeparator;
    options.separator = absl::GetFlag(FLAGS_separator);
    if (options.separator.empty()) return Fail("--separator: must not be empty", 2);
  } else if (split == "blank") {
    options.format = tally::data::CorpusFormat::kTextBlankLine;
  } else if (split == "file") {
    options.format = tally::data::CorpusFormat::kTextFile;
  } else {
    return Fail("--split: must be separator, blank or file, got \"" + split + "\"", 2);
  }
  const double val_fraction = absl::GetFlag(FLAGS_val_fraction);
  if (!(val_fraction > 0 && val_fraction < 1)) {
    return Fail(absl::StrCat("--val_fraction: must be between 0 and 1 (exclusive), got ",
                             val_fraction), 2);
  }
  if (std::system(("mkdir -p '" + out + "'").c_str()) != 0) {
    return Fail("cannot create --out directory " + out);
  }

  auto train = tally::data::DatasetWriter::Create(out + "/train");
  if (!train.ok()) return Fail(std::string(train.status().message()));
  auto val = tally::data::DatasetWriter::Create(out + "/val");
  if (!val.ok()) return Fail(std::string(val.status().message()));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const uint64_t threshold = static_cast<uint64_t>(val_fraction * 1e9);
  std::vector<uint16_t> tokens;
  int64_t text_bytes = 0;
  for (const std::string& path : inputs) {
    absl::Status s = tally::data::ReadCorpusFile(
        path, options,
        [&](absl::string_view text, const tally::data::DocumentSource&) {
          tokens.clear();
          tally::data::ByteTokenizer::Encode(text, &tokens);
          text_bytes += static_cast<int64_t>(text.size());
          auto& w = Fnv1a(text, seed) % 1000000000ULL < threshold ? *val : *train;
          return w->Add(tokens);
        });
    if (!s.ok()) return Fail(std::string(s.message()), 2);
  }
  if ((*train)->num_docs() + (*val)->num_docs() == 0) {
    return Fail(absl::StrCat("the corpus is empty: no documents in ",
                             absl::StrJoin(inputs, ", "),
                             " (check --format, --split and --separator)"), 2);
  }
  if ((*val)->num_docs() == 0 || (*train)->num_docs() == 0) {
    return Fail(absl::StrCat("only ", (*train)->num_docs() + (*val)->num_docs(),
                             " documents: too few for a train/validation split "
                             "(raise --val_fraction or add documents)"), 2);
  }
  nlohmann::json extra = {{"sources", inputs}, {"format", format},
                          {"val_fraction", val_fraction}, {"seed", seed}};
  for (auto& [writer, split_name] : {std::pair{train->get(), "train"},
                                      std::pair{val->get(), "val"}}) {
    extra["split"] = split_name;
    if (auto s = writer->Finish(extra.dump()); !s.ok()) return Fail(std::string(s.message()));
  }
  std::cout << "tally-prep: " << out << "/train: " << (*train)->num_docs() << " documents, "
            << (*train)->num_tokens() << " tokens; " << out << "/val: " << (*val)->num_docs()
            << " documents, " << (*val)->num_tokens() << " tokens (" << text_bytes
            << " bytes of text)\n";
  return 0;
}
