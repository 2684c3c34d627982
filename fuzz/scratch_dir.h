// A per-process scratch directory for fuzz targets whose code under test reads
// files: on tmpfs (/dev/shm) where there is one, removed at exit.
#ifndef TALLY_FUZZ_SCRATCH_DIR_H_
#define TALLY_FUZZ_SCRATCH_DIR_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tally::fuzz {

inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    if (const char* t = std::getenv("TALLY_FUZZ_TMPDIR")) base = t;
    std::string templ = base + "/tally-fuzz.XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror(("mkdtemp " + templ).c_str());
      std::abort();
    }
    auto* d = new std::string(templ);
    std::atexit([] {
      std::system(("rm -rf '" + ScratchDir() + "'").c_str());
    });
    return d;
  }();
  return *dir;
}

inline void WriteFileOrDie(const std::string& path, const std::string& contents) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr ||
      std::fwrite(contents.data(), 1, contents.size(), f) != contents.size() ||
      std::fclose(f) != 0) {
    std::perror(("writing " + path).c_str());
    std::abort();
  }
}

}  // namespace tally::fuzz

#endif  // TALLY_FUZZ_SCRATCH_DIR_H_
