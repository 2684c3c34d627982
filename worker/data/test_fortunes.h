// For tests: a dataset of byte-tokenized fortunes (the Debian package
// scripts/setup.sh installs), written with the dataset writer.
#ifndef TALLY_WORKER_DATA_TEST_FORTUNES_H_
#define TALLY_WORKER_DATA_TEST_FORTUNES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"

namespace tally::data {

// Writes the dataset `prefix` from /usr/share/games/fortunes/FILE for each
// of `files`.
inline void WriteFortunes(const std::string& prefix, const std::vector<std::string>& files) {
  auto w = DatasetWriter::Create(prefix);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const auto& f : files) {
    absl::Status s = ReadCorpusFile(
        "/usr/share/games/fortunes/" + f, {},
        [&](absl::string_view text, const DocumentSource&) {
          std::vector<uint16_t> t;
          ByteTokenizer::Encode(text, &t);
          return (*w)->Add(t);
        });
    ASSERT_TRUE(s.ok()) << s << " (scripts/setup.sh installs the fortunes package)";
  }
  ASSERT_TRUE((*w)->Finish("").ok());
}

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_TEST_FORTUNES_H_
