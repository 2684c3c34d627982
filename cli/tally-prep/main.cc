// tally-prep: turns text or JSONL corpora into the tokenized, memory-mapped
// dataset the trainer reads: OUT/train.{bin,idx,json} and OUT/val.{...}, split
// by document, deterministically (a hash of the document's text and --seed).
// `tally-prep verify DIR|PREFIX` re-checks a prepared dataset: the structure,
// the token ids and the SHA-256 of its files recorded at prep time.
// `tally-prep train-tokenizer --vocab_size=N --out=tok.model FILES...` trains
// a SentencePiece model on a corpus, for --tokenizer=sentencepiece:tok.model.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/holdout.h"
#include "worker/data/sentencepiece.h"
#include "worker/data/tokenizer.h"

ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(std::string, format, "text", "input format: text or jsonl");
ABSL_FLAG(std::string, split, "separator",
          "how text files divide into documents: separator (a line equal to "
          "--separator, as in fortune files), blank (blank lines) or file (one "
          "document per file)");
ABSL_FLAG(std::string, separator, "%", "document separator line for --split=separator");
ABSL_FLAG(std::string, field, "text",
          "JSONL field holding the document: its text, or (with --vocab_size) an array of "
          "token ids, e.g. --field=input_ids");
ABSL_FLAG(std::string, tokenizer, "byte",
          "byte (the 258-symbol byte vocabulary) or sentencepiece:PATH (a SentencePiece "
          "tokenizer.model: Llama 2, Mistral, Gemma, or one from train-tokenizer)");
ABSL_FLAG(int64_t, vocab_size, 0,
          "pre-tokenized input: --format=jsonl whose --field holds token ids, each below this; "
          "train-tokenizer: the vocabulary to learn");
ABSL_FLAG(std::string, bos, "none",
          "pre-tokenized input: the BOS id, put before each document that does not start "
          "with it, or none");
ABSL_FLAG(std::string, eos, "none",
          "pre-tokenized input: the EOS id, put after each document that does not end with "
          "it, or none");
ABSL_FLAG(std::string, model_type, "bpe", "train-tokenizer: bpe or unigram");
ABSL_FLAG(double, val_fraction, 0.05,
          "fraction of documents held out for validation (by a seeded hash of each)");
ABSL_FLAG(int64_t, val_tokens, 0,
          "hold out about this many tokens instead of --val_fraction, with documents spread "
          "across lengths (systematic sampling over the documents sorted by length); a "
          "document longer than 10% of it stays in training, so that no one document decides "
          "the validation loss. Reads the corpus twice");
ABSL_FLAG(uint64_t, seed, 0, "changes which documents are held out");
ABSL_FLAG(int64_t, max_line_bytes, int64_t{64} << 20,
          "longest input line accepted, in bytes (a JSONL line holds a whole document)");
ABSL_FLAG(int64_t, max_doc_bytes, int64_t{64} << 20,
          "longest document accepted, in bytes of text");

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

// Sources are recorded in each split's metadata up to this many.
constexpr size_t kMaxRecordedSources = 1000;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool HasDatasetFiles(const std::string& prefix) {
  return Exists(prefix + ".json") || Exists(prefix + ".idx") || Exists(prefix + ".bin");
}

// --bos / --eos: an id below vocab_size, or none (-1).
bool ParseSpecial(const std::string& flag, const std::string& value, int64_t vocab, int64_t* out,
                  std::string* error) {
  if (value == "none" || value.empty()) {
    *out = -1;
    return true;
  }
  if (!absl::SimpleAtoi(value, out) || *out < 0 || *out >= vocab) {
    *error = absl::StrCat("--", flag, ": must be a token id below --vocab_size (", vocab,
                          ") or none, got \"", value, "\"");
    return false;
  }
  return true;
}

tally::data::CorpusOptions CorpusOptionsFromFlags(int* code, std::string* error);

// `tally-prep train-tokenizer --vocab_size=N --out=tok.model FILES...`.
int TrainTokenizer(const std::vector<std::string>& files) {
  if (files.empty()) return Fail("train-tokenizer: no input files: give one or more corpora", 2);
  tally::data::TrainTokenizerOptions options;
  options.out = absl::GetFlag(FLAGS_out);
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  options.model_type = absl::GetFlag(FLAGS_model_type);
  if (options.out.empty()) return Fail("train-tokenizer: --out=FILE.model is required", 2);
  if (options.vocab_size < 16 || options.vocab_size > 1000000) {
    return Fail(absl::StrCat("train-tokenizer: --vocab_size: must be between 16 and 1000000, "
                             "got ",
                             options.vocab_size),
                2);
  }
  int code = 0;
  std::string error;
  tally::data::CorpusOptions corpus = CorpusOptionsFromFlags(&code, &error);
  if (code != 0) return Fail(error, code);
  // The trainer samples its sentences; memory stays bounded: documents past
  // the first kMaxTokenizerText bytes are read (and checked) but not kept.
  constexpr int64_t kMaxTokenizerText = int64_t{1} << 30;
  std::vector<std::string> docs;
  int64_t kept = 0, skipped = 0;
  for (const std::string& path : files) {
    absl::Status s = tally::data::ReadCorpusFile(
        path, corpus, [&](absl::string_view text, const tally::data::DocumentSource&) {
          if (kept + static_cast<int64_t>(text.size()) > kMaxTokenizerText) {
            ++skipped;
          } else {
            kept += static_cast<int64_t>(text.size());
            docs.emplace_back(text);
          }
          return absl::OkStatus();
        });
    if (!s.ok()) return Fail(std::string(s.message()), 2);
  }
  if (skipped > 0) {
    std::cerr << "tally-prep: train-tokenizer: trained on the first " << docs.size()
              << " documents (" << kept << " bytes); " << skipped << " more were not used\n";
  }
  if (absl::Status s = tally::data::TrainSentencePiece(docs, options); !s.ok()) {
    return Fail("train-tokenizer: " + std::string(s.message()));
  }
  auto check = tally::data::SentencePieceTokenizer::Load(options.out);
  if (!check.ok()) return Fail("train-tokenizer: " + std::string(check.status().message()));
  std::cout << "tally-prep: trained a " << options.model_type << " SentencePiece model of "
            << (*check)->record().vocab_size << " pieces on " << docs.size()
            << " documents: " << options.out << " (use --tokenizer=sentencepiece:" << options.out
            << ")\n";
  return 0;
}

// `tally-prep verify PATH`: PATH is the --out directory (its train and val
// splits are checked), a prefix such as DIR/train, or one of its files.
// Exit 0: every check passed; 1: a check failed or the content cannot be
// verified; 2: usage.
int Verify(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Fail("usage: tally-prep verify DIR (the --out directory) or tally-prep verify "
                "DIR/train (one split)", 2);
  }
  std::string path = args[0];
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::vector<std::string> prefixes;
  if (IsDirectory(path)) {
    // tally-prep writes both splits, so a directory with either must have both.
    if (HasDatasetFiles(path + "/train") || HasDatasetFiles(path + "/val")) {
      prefixes = {path + "/train", path + "/val"};
    } else {
      return Fail(absl::StrCat(path, ": no dataset here (no train.* or val.*): give the "
                               "directory tally-prep --out wrote, or a prefix such as DIR/train"),
                  2);
    }
  } else {
    for (const char* ext : {".json", ".idx", ".bin"}) {
      if (absl::EndsWith(path, ext) && Exists(path)) {
        path.resize(path.size() - std::strlen(ext));
        break;
      }
    }
    if (!HasDatasetFiles(path)) {
      return Fail(absl::StrCat(path, ": no dataset here (no ", path, ".json, .idx or .bin): "
                               "give the directory tally-prep --out wrote, or a prefix such "
                               "as DIR/train"),
                  2);
    }
    prefixes.push_back(path);
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  std::vector<std::string> parts;
  for (const std::string& prefix : prefixes) {
    auto ds = tally::data::Dataset::Open(prefix);
    if (!ds.ok()) return Fail("verify: " + std::string(ds.status().message()));
    if (absl::Status s = (*ds)->VerifyContentHash(); !s.ok()) {
      return Fail("verify: " + std::string(s.message()));
    }
    bytes += (*ds)->bin_bytes() + (*ds)->idx_bytes();
    parts.push_back(absl::StrCat(prefix, " (", (*ds)->num_docs(), " documents, ",
                                 (*ds)->num_tokens(), " tokens)"));
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.2f",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::cout << "tally-prep verify: OK " << absl::StrJoin(parts, ", ")
            << ": structure, token ids and SHA-256 of " << 2 * prefixes.size()
            << " files match (" << bytes << " bytes in "
            << seconds << " s)\n";
  return 0;
}

// --format, --split, --separator, --field and the limits as CorpusOptions;
// *code 2 and *error on a bad flag.
tally::data::CorpusOptions CorpusOptionsFromFlags(int* code, std::string* error) {
  tally::data::CorpusOptions options;
  const std::string format = absl::GetFlag(FLAGS_format);
  const std::string split = absl::GetFlag(FLAGS_split);
  auto bad = [&](const std::string& e) {
    *code = 2;
    *error = e;
    return options;
  };
  if (format == "jsonl") {
    options.format = tally::data::CorpusFormat::kJsonl;
    options.field = absl::GetFlag(FLAGS_field);
  } else if (format != "text") {
    return bad("--format: must be text or jsonl, got \"" + format + "\"");
  } else if (split == "separator") {
    options.format = tally::data::CorpusFormat::kTextSeparator;
    options.separator = absl::GetFlag(FLAGS_separator);
    if (options.separator.empty()) return bad("--separator: must not be empty");
  } else if (split == "blank") {
    options.format = tally::data::CorpusFormat::kTextBlankLine;
  } else if (split == "file") {
    options.format = tally::data::CorpusFormat::kTextFile;
  } else {
    return bad("--split: must be separator, blank or file, got \"" + split + "\"");
  }
  options.max_line_bytes = absl::GetFlag(FLAGS_max_line_bytes);
  options.max_doc_bytes = absl::GetFlag(FLAGS_max_doc_bytes);
  if (options.max_line_bytes < 1 || options.max_doc_bytes < 1) {
    return bad("--max_line_bytes and --max_doc_bytes: must be positive");
  }
  return options;
}

// How the input becomes tokens: bytes, a SentencePiece model, or ids
// already in the input (--vocab_size).
struct Tokenizing {
  bool pretokenized = false;
  int64_t vocab = 0;
  tally::data::TokenizerRecord record;
  std::unique_ptr<tally::data::SentencePieceTokenizer> spm;  // null: bytes
};

// The tokenizer flags, checked (INVALID_ARGUMENT naming the flag).
absl::StatusOr<Tokenizing> TokenizingFromFlags(const std::string& format) {
  const int64_t vocab = absl::GetFlag(FLAGS_vocab_size);
  const std::string tokenizer = absl::GetFlag(FLAGS_tokenizer);
  Tokenizing t;
  t.vocab = vocab;
  t.pretokenized = vocab != 0;
  tally::data::TokenizerRecord& record = t.record;
  std::string error;
  if (t.pretokenized) {
    if (format != "jsonl") {
      return absl::InvalidArgumentError(
          "--vocab_size: pre-tokenized input is read from JSONL (--format=jsonl "
          "--field=input_ids)");
    }
    if (tokenizer != "byte") {
      return absl::InvalidArgumentError(
          "--tokenizer: pre-tokenized input (--vocab_size) is not tokenized again; "
          "drop --tokenizer");
    }
    if (vocab < 2 || vocab > tally::data::kMaxVocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab_size: must be between 2 and ", tally::data::kMaxVocab, ", got ", vocab));
    }
    record.kind = "pretokenized";
    record.vocab_size = vocab;
    if (!ParseSpecial("bos", absl::GetFlag(FLAGS_bos), vocab, &record.bos, &error) ||
        !ParseSpecial("eos", absl::GetFlag(FLAGS_eos), vocab, &record.eos, &error)) {
      return absl::InvalidArgumentError(error);
    }
  } else if (absl::GetFlag(FLAGS_bos) != "none" || absl::GetFlag(FLAGS_eos) != "none") {
    return absl::InvalidArgumentError(
        "--bos/--eos: only for pre-tokenized input (with --vocab_size); a tokenizer "
        "brings its own");
  } else if (absl::StartsWith(tokenizer, "sentencepiece:")) {
    auto loaded = tally::data::SentencePieceTokenizer::Load(tokenizer.substr(14));
    if (!loaded.ok()) {
      return absl::InvalidArgumentError("--tokenizer: " + std::string(loaded.status().message()));
    }
    t.spm = *std::move(loaded);
    record = t.spm->record();
  } else if (tokenizer != "byte") {
    return absl::InvalidArgumentError("--tokenizer: must be byte or sentencepiece:PATH, got \"" +
                                      tokenizer + "\"");
  }
  return t;
}

// Where each document goes. By default a seeded hash of the document picks
// (--val_fraction); with `held_out` its ordinal in the corpus does
// (--val_tokens); with `measure` nothing is written, each document's token
// count is recorded (the first of --val_tokens' two passes). `val_lengths`
// collects the token counts of what went to validation.
struct Routing {
  const std::vector<bool>* held_out = nullptr;
  std::vector<int64_t>* measure = nullptr;
  std::vector<int64_t>* val_lengths = nullptr;
};

// Splits each input's documents between the two writers as `routing` says
// and tokenizes them; INVALID_ARGUMENT names the file and line of a document
// that cannot be. Counts the text's bytes.
absl::Status WriteDocuments(const std::vector<std::string>& inputs,
                            const tally::data::CorpusOptions& options, const Tokenizing& tok,
                            tally::data::DatasetWriter* train, tally::data::DatasetWriter* val,
                            const Routing& routing, int64_t* text_bytes) {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const uint64_t threshold =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_val_fraction) * 1e9);
  int64_t ordinal = 0;
  // The writer for the next document (nullptr: only measured), whose key
  // is `key` and length `n` tokens.
  auto route = [&](absl::string_view key, size_t n) -> tally::data::DatasetWriter* {
    const int64_t at = ordinal++;
    if (routing.measure) {
      routing.measure->push_back(static_cast<int64_t>(n));
      return nullptr;
    }
    const bool to_val =
        routing.held_out ? (at < static_cast<int64_t>(routing.held_out->size()) &&
                            (*routing.held_out)[at])
                         : Fnv1a(key, seed) % 1000000000ULL < threshold;
    if (to_val && routing.val_lengths) routing.val_lengths->push_back(static_cast<int64_t>(n));
    return to_val ? val : train;
  };
  const tally::data::TokenizerRecord& record = tok.record;
  const int64_t vocab = tok.vocab;
  const tally::data::SentencePieceTokenizer* spm = tok.spm.get();
  std::vector<uint16_t> bytes;
  std::vector<uint32_t> tokens;
  auto where = [](const tally::data::DocumentSource& at) {
    return absl::StrCat(*at.file, ":", at.first_line, ": ");
  };
  for (const std::string& path : inputs) {
    absl::Status s;
    if (tok.pretokenized) {
      s = tally::data::ReadTokenIdsFile(
          path, options, vocab,
          [&](absl::Span<const uint32_t> ids, const tally::data::DocumentSource& at) {
            tokens.clear();
            if (record.bos >= 0 && ids.front() != static_cast<uint32_t>(record.bos)) {
              tokens.push_back(static_cast<uint32_t>(record.bos));
            }
            tokens.insert(tokens.end(), ids.begin(), ids.end());
            if (record.eos >= 0 && ids.back() != static_cast<uint32_t>(record.eos)) {
              tokens.push_back(static_cast<uint32_t>(record.eos));
            }
            const absl::string_view key(reinterpret_cast<const char*>(tokens.data()),
                                        tokens.size() * sizeof(uint32_t));
            tally::data::DatasetWriter* w = route(key, tokens.size());
            if (w == nullptr) return absl::OkStatus();
            absl::Status added = w->Add(tokens, 0);
            return added.ok()
                       ? added
                       : absl::InvalidArgumentError(where(at) + std::string(added.message()));
          });
    } else {
      s = tally::data::ReadCorpusFile(
          path, options, [&](absl::string_view text, const tally::data::DocumentSource& at) {
            if (spm == nullptr) {
              bytes.clear();
              tally::data::ByteTokenizer::Encode(text, &bytes);
              tally::data::DatasetWriter* w = route(text, bytes.size());
              if (w == nullptr) return absl::OkStatus();
              *text_bytes += static_cast<int64_t>(text.size());
              return w->Add(bytes);
            }
            tokens.clear();
            if (absl::Status e = spm->Encode(text, &tokens); !e.ok()) {
              return absl::InvalidArgumentError(where(at) + std::string(e.message()));
            }
            tally::data::DatasetWriter* w = route(text, tokens.size());
            if (w == nullptr) return absl::OkStatus();
            *text_bytes += static_cast<int64_t>(text.size());
            return w->Add(tokens, static_cast<int64_t>(text.size()));
          });
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Whether --NAME (or -NAME, with =VALUE or a separate value) is among the
// arguments, before a "--" that ends the flags.
bool GivenOnCommandLine(int argc, char** argv, absl::string_view name) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--") break;
    if (!absl::ConsumePrefix(&a, "--")) absl::ConsumePrefix(&a, "-");
    if (a == name || absl::StartsWith(a, absl::StrCat(name, "="))) return true;
  }
  return false;
}

// How concentrated the validation split is, and what --val_tokens left out.
// A split whose tokens sit in a few documents gives a loss that mostly says
// whether the model saw text like those few: warned above 10%.
void ReportValidationSplit(const std::vector<int64_t>& val_lengths,
                           const tally::data::Holdout* holdout) {
  const double share = tally::data::LargestDocumentShare(val_lengths);
  std::cout << absl::StrFormat(
      "tally-prep: validation split: its largest document holds %.1f%% of its tokens\n",
      100 * share);
  if (holdout != nullptr && holdout->num_too_long > 0) {
    std::cout << "tally-prep: --val_tokens: " << holdout->num_too_long
              << " documents longer than 10% of it stayed in training\n";
  }
  if (share > tally::data::kConcentratedShare) {
    std::cerr << absl::StrFormat(
        "tally-prep: warning: the validation split is concentrated: one document holds "
        "%.1f%% of its tokens (over %.0f%%), so a few long documents decide its "
        "token-weighted loss; hold out by tokens with --val_tokens=N (documents spread "
        "across lengths), or judge by the document-weighted loss (doc_val_loss)\n",
        100 * share, 100 * tally::data::kConcentratedShare);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-prep: tokenize corpora into a tally dataset.\n\nUsage: tally-prep "
      "--out=DIR [--format=text|jsonl] [--split=separator|blank|file] "
      "[--tokenizer=byte|sentencepiece:PATH] FILE...\n"
      "       tally-prep --out=DIR --format=jsonl --field=input_ids --vocab_size=N "
      "[--bos=ID] [--eos=ID] FILE...   (pre-tokenized)\n"
      "       tally-prep train-tokenizer --vocab_size=N --out=tok.model "
      "[--model_type=bpe|unigram] FILE...\n"
      "       tally-prep verify DIR|DIR/train\n"
      "Writes DIR/train.{bin,idx,json} and DIR/val.{bin,idx,json}; a job spec "
      "names DIR/train as data.train_path. verify re-checks a written dataset "
      "against the SHA-256 recorded in its .json (exit 0 OK, 1 damaged or "
      "unverifiable, 2 usage).");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> inputs(args.begin() + 1, args.end());
  if (!inputs.empty() && inputs[0] == "verify") {
    return Verify(std::vector<std::string>(inputs.begin() + 1, inputs.end()));
  }
  if (!inputs.empty() && inputs[0] == "train-tokenizer") {
    return TrainTokenizer(std::vector<std::string>(inputs.begin() + 1, inputs.end()));
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail("--out is required: the dataset directory to write", 2);
  if (inputs.empty()) return Fail("no input files: give one or more corpus files", 2);
  int code = 0;
  std::string error;
  const tally::data::CorpusOptions options = CorpusOptionsFromFlags(&code, &error);
  if (code != 0) return Fail(error, code);
  const std::string format = absl::GetFlag(FLAGS_format);
  absl::StatusOr<Tokenizing> tok = TokenizingFromFlags(format);
  if (!tok.ok()) return Fail(std::string(tok.status().message()), 2);
  const tally::data::TokenizerRecord& record = tok->record;
  const bool pretokenized = tok->pretokenized;
  const double val_fraction = absl::GetFlag(FLAGS_val_fraction);
  if (!(val_fraction > 0 && val_fraction < 1)) {
    return Fail(absl::StrCat("--val_fraction: must be between 0 and 1 (exclusive), got ",
                             val_fraction), 2);
  }
  const int64_t val_tokens = absl::GetFlag(FLAGS_val_tokens);
  if (val_tokens < 0) {
    return Fail(absl::StrCat("--val_tokens: must be >= 0 (0: hold out by --val_fraction), got ",
                             val_tokens), 2);
  }
  if (val_tokens > 0 && GivenOnCommandLine(argc, argv, "val_fraction")) {
    return Fail("--val_tokens and --val_fraction: give one (--val_tokens holds out by tokens, "
                "--val_fraction by documents)", 2);
  }
  if (std::system(("mkdir -p '" + out + "'").c_str()) != 0) {
    return Fail("cannot create --out directory " + out);
  }

  auto train = tally::data::DatasetWriter::Create(out + "/train", record);
  if (!train.ok()) return Fail(std::string(train.status().message()));
  auto val = tally::data::DatasetWriter::Create(out + "/val", record);
  if (!val.ok()) return Fail(std::string(val.status().message()));
  int64_t text_bytes = 0;
  std::vector<int64_t> val_lengths;
  Routing routing;
  routing.val_lengths = &val_lengths;
  tally::data::Holdout holdout;
  if (val_tokens > 0) {
    std::vector<int64_t> lengths;
    Routing measure;
    measure.measure = &lengths;
    int64_t unused = 0;
    if (absl::Status s = WriteDocuments(inputs, options, *tok, nullptr, nullptr, measure, &unused);
        !s.ok()) {
      return Fail(std::string(s.message()), 2);
    }
    holdout = tally::data::StratifiedHoldout(lengths, val_tokens, absl::GetFlag(FLAGS_seed));
    routing.held_out = &holdout.held_out;
  }
  if (absl::Status s =
          WriteDocuments(inputs, options, *tok, train->get(), val->get(), routing, &text_bytes);
      !s.ok()) {
    return Fail(std::string(s.message()), 2);
  }
  if ((*train)->num_docs() + (*val)->num_docs() == 0) {
    return Fail(absl::StrCat("the corpus is empty: no documents in ",
                             absl::StrJoin(inputs, ", "),
                             " (check --format, --split and --separator)"), 2);
  }
  if ((*val)->num_docs() == 0 || (*train)->num_docs() == 0) {
    return Fail(absl::StrCat("only ", (*train)->num_docs() + (*val)->num_docs(),
                             " documents: too few for a train/validation split "
                             "(raise --val_fraction or --val_tokens, or add documents)"), 2);
  }
  const std::vector<std::string> recorded(
      inputs.begin(), inputs.begin() + std::min(inputs.size(), kMaxRecordedSources));
  nlohmann::json extra = {{"sources", recorded},
                          {"num_sources", inputs.size()},
                          {"format", format},
                          {"val_fraction", val_tokens > 0 ? 0.0 : val_fraction},
                          {"val_tokens", val_tokens},
                          {"seed", absl::GetFlag(FLAGS_seed)},
                          {"field", format == "jsonl" ? options.field : ""}};
  for (auto& [writer, split_name] : {std::pair{train->get(), "train"},
                                      std::pair{val->get(), "val"}}) {
    extra["split"] = split_name;
    if (auto s = writer->Finish(extra.dump()); !s.ok()) return Fail(std::string(s.message()));
  }
  std::cout << "tally-prep: " << out << "/train: " << (*train)->num_docs() << " documents, "
            << (*train)->num_tokens() << " tokens; " << out << "/val: " << (*val)->num_docs()
            << " documents, " << (*val)->num_tokens() << " tokens; tokenizer " << record.kind
            << ", vocabulary " << record.vocab_size;
  if (pretokenized) {
    std::cout << " (pre-tokenized)\n";
  } else {
    std::cout << " (" << text_bytes << " bytes of text)\n";
  }
  ReportValidationSplit(val_lengths, val_tokens > 0 ? &holdout : nullptr);
  return 0;
}
