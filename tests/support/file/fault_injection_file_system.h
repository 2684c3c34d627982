// FaultInjectionFileSystem: a FileSystem that forwards to another and fails
// on demand, as LevelDB's FaultInjectionTestEnv does, so that tests can show
// a failed write leaves the file that was there (or none) and nothing half
// written. Header-only; for tests.
#ifndef TALLY_TESTS_SUPPORT_FILE_FAULT_INJECTION_FILE_SYSTEM_H_
#define TALLY_TESTS_SUPPORT_FILE_FAULT_INJECTION_FILE_SYSTEM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file/file_system.h"

namespace tally::file {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  // `base` must outlive this.
  explicit FaultInjectionFileSystem(FileSystem* base) : base_(base) {}

  // Appends fail once this many bytes have been appended to a file (-1:
  // never), as a full disk would; so does a WriteAt that would take the
  // bytes written (appended or overwritten) past it.
  void FailAppendsAfter(int64_t bytes) { fail_after_ = bytes; }
  // Commit fails (the file is not renamed into place).
  void FailCommits(bool fail) { fail_commits_ = fail; }
  // NewAtomicFile fails.
  void FailCreates(bool fail) { fail_creates_ = fail; }
  // ReadAtMost, FileSize and an AtomicFile's ReadAt fail.
  void FailReads(bool fail) { fail_reads_ = fail; }

  absl::StatusOr<std::unique_ptr<AtomicFile>> NewAtomicFile(const std::string& path) override {
    if (fail_creates_) return absl::InternalError("injected fault: creating " + path + ".tmp");
    auto f = base_->NewAtomicFile(path);
    if (!f.ok()) return f.status();
    return std::unique_ptr<AtomicFile>(new File(this, std::move(*f), path));
  }
  absl::StatusOr<std::string> ReadAtMost(const std::string& path, size_t max_bytes) override {
    if (fail_reads_) return absl::InternalError("injected fault: reading " + path);
    return base_->ReadAtMost(path, max_bytes);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    if (fail_reads_) return absl::InternalError("injected fault: stat " + path);
    return base_->FileSize(path);
  }

 private:
  class File final : public AtomicFile {
   public:
    File(FaultInjectionFileSystem* fs, std::unique_ptr<AtomicFile> base, std::string path)
        : fs_(fs), base_(std::move(base)), path_(std::move(path)) {}
    absl::Status Append(absl::string_view bytes) override {
      if (auto s = Count(bytes.size(), ""); !s.ok()) return s;
      return base_->Append(bytes);
    }
    absl::Status WriteAt(uint64_t offset, absl::string_view bytes) override {
      if (auto s = Count(bytes.size(), absl::StrCat(" at ", offset)); !s.ok()) return s;
      return base_->WriteAt(offset, bytes);
    }
    absl::StatusOr<std::string> ReadAt(uint64_t offset, size_t n) override {
      if (fs_->fail_reads_) {
        return absl::InternalError("injected fault: reading back " + path_ + ".tmp");
      }
      return base_->ReadAt(offset, n);
    }
    absl::Status Commit() override {
      if (fs_->fail_commits_) return absl::InternalError("injected fault: renaming " + path_);
      return base_->Commit();
    }

   private:
    // Counts `n` more bytes written, or fails them once past the limit.
    absl::Status Count(size_t n, const std::string& where) {
      const int64_t limit = fs_->fail_after_;
      if (limit >= 0 && written_ + static_cast<int64_t>(n) > limit) {
        return absl::InternalError(absl::StrCat("injected fault: writing ", path_, ".tmp", where,
                                                " after ", written_, " bytes"));
      }
      written_ += static_cast<int64_t>(n);
      return absl::OkStatus();
    }

    FaultInjectionFileSystem* fs_;
    std::unique_ptr<AtomicFile> base_;
    std::string path_;
    int64_t written_ = 0;
  };

  FileSystem* base_;
  std::atomic<int64_t> fail_after_{-1};
  std::atomic<bool> fail_commits_{false}, fail_creates_{false}, fail_reads_{false};
};

}  // namespace tally::file

#endif  // TALLY_TESTS_SUPPORT_FILE_FAULT_INJECTION_FILE_SYSTEM_H_
