#include "common/path_confinement.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/text.h"

namespace tally {

namespace fs = std::filesystem;

absl::StatusOr<fs::path> ResolvePath(const std::string& path, const fs::path& base) {
  if (path.empty()) return absl::InvalidArgumentError("the path is empty");
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("the path holds a NUL byte");
  }
  fs::path p(path);
  if (p.is_relative()) p = base / p;
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot resolve it: ", ec.message()));
  resolved = resolved.lexically_normal();
  // weakly_canonical resolved every part that exists, so a symlink still in
  // the result is one whose target does not exist (yet).
  fs::path prefix;
  for (const fs::path& part : resolved) {
    if (part.empty()) continue;
    prefix /= part;
    const fs::file_status st = fs::symlink_status(prefix, ec);
    if (ec) break;  // does not exist: nothing further can be a link either
    if (fs::is_symlink(st)) {
      std::error_code read_ec;
      const fs::path target = fs::read_symlink(prefix, read_ec);
      return absl::InvalidArgumentError(
          absl::StrCat(EscapeUnprintable(prefix.string()), " is a symlink to ",
                       read_ec ? "?" : EscapeUnprintable(target.string()),
                       ", which does not exist (a dangling link could later point anywhere)"));
    }
  }
  return resolved;
}

bool IsWithin(const fs::path& path, const fs::path& dir) {
  const fs::path p = path.lexically_normal();
  const fs::path d = dir.lexically_normal();
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di) {
    if (di->empty()) continue;  // a trailing separator
    while (pi != p.end() && pi->empty()) ++pi;
    if (pi == p.end() || *pi != *di) return false;
    ++pi;
  }
  return true;
}

std::vector<std::string> DatasetFiles(const std::string& prefix) {
  return {prefix + ".json", prefix + ".idx", prefix + ".bin"};
}

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& roots,
                                          const fs::path& base, Wording wording) {
  DataRoots out;
  out.base_ = base;
  out.wording_ = std::move(wording);
  const std::string& flag = out.wording_.flag;
  for (const std::string& root : roots) {
    if (root.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": an empty root (two commas in a row, or a trailing comma?)"));
    }
    fs::path p(root);
    if (p.is_relative()) p = base / p;
    std::error_code ec;
    const fs::path canonical = fs::canonical(p, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", EscapeUnprintable(root), ": ", ec.message(),
                       " (each data root must be an existing directory)"));
    }
    if (!fs::is_directory(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", EscapeUnprintable(root), " is not a directory (it resolves to ",
                       EscapeUnprintable(canonical.string()), ")"));
    }
    if (std::find(out.roots_.begin(), out.roots_.end(), canonical) == out.roots_.end()) {
      out.roots_.push_back(canonical);
      out.configured_.push_back(root);
    }
  }
  return out;
}

std::string DataRoots::Describe() const {
  return absl::StrJoin(roots_, ", ", [](std::string* out, const fs::path& p) {
    out->append(EscapeUnprintable(p.string()));
  });
}

std::string DataRoots::DescribeConfigured() const {
  return absl::StrJoin(configured_, ", ", [](std::string* out, const std::string& p) {
    out->append(EscapeUnprintable(p));
  });
}

absl::Status DataRoots::CheckDataset(absl::string_view field, const std::string& prefix) const {
  return CheckFiles(field, prefix, DatasetFiles(prefix));
}

absl::Status DataRoots::CheckFiles(absl::string_view field, const std::string& prefix,
                                   const std::vector<std::string>& files) const {
  if (!confining()) return absl::OkStatus();
  const std::string quoted = absl::StrCat("\"", EscapeUnprintable(prefix), "\"");
  auto inside = [&](const fs::path& p) {
    return std::any_of(roots_.begin(), roots_.end(),
                       [&](const fs::path& root) { return IsWithin(p, root); });
  };
  auto refuse = [&](absl::string_view which, const fs::path& resolved) {
    if (!wording_.echo_resolved) {
      return absl::Status(
          wording_.code,
          absl::StrCat(field, " ", quoted, which, " is outside ", wording_.roots, " (",
                       DescribeConfigured(), "); ", wording_.fix));
    }
    return absl::Status(
        wording_.code,
        absl::StrCat(field, " ", quoted, which, " resolves to ",
                     EscapeUnprintable(resolved.string()), ", outside ", wording_.roots, " (",
                     Describe(), "); ", wording_.fix));
  };
  // Why a path does not resolve, in terms that may reach the caller: the
  // dangling-link message names the link's place and target on this host.
  auto unresolved = [&](const absl::Status& s) -> std::string {
    if (wording_.echo_resolved || !absl::StrContains(s.message(), "which does not exist")) {
      return std::string(s.message());
    }
    return "it passes through a symlink whose target does not exist (a dangling link could "
           "later point anywhere)";
  };
  absl::StatusOr<fs::path> resolved_prefix = ResolvePath(prefix, base_);
  if (!resolved_prefix.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", quoted, ": ", unresolved(resolved_prefix.status())));
  }
  // The prefix itself is never opened, but when it is already outside, say
  // so in the terms the spec used.
  if (!inside(*resolved_prefix)) return refuse("", *resolved_prefix);
  // The files beside the prefix: this catches a prefix that is a root
  // itself (its files are in the folder above) and a file that is a link out.
  for (const std::string& file : files) {
    absl::StatusOr<fs::path> resolved = ResolvePath(file, base_);
    if (!resolved.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", quoted, " (its file ",
                                                     EscapeUnprintable(file),
                                                     "): ", unresolved(resolved.status())));
    }
    if (!inside(*resolved)) {
      return refuse(absl::StrCat(" (its file ", EscapeUnprintable(file), ")"), *resolved);
    }
  }
  return absl::OkStatus();
}

absl::Status DataRoots::CheckInitFrom(absl::string_view field_prefix, const std::string& hf,
                                      const std::string& checkpoint) const {
  return CheckWeights(absl::StrCat(field_prefix, "model.init_from"), hf, checkpoint);
}

absl::Status DataRoots::CheckWeights(absl::string_view field, const std::string& hf,
                                     const std::string& checkpoint) const {
  if (!hf.empty()) {
    if (absl::Status s = CheckFiles(absl::StrCat(field, ".hf"), hf,
                                    {hf + "/config.json", hf + "/model.safetensors"});
        !s.ok()) {
      return s;
    }
  }
  if (!checkpoint.empty()) {
    return CheckFiles(absl::StrCat(field, ".checkpoint"), checkpoint, {checkpoint});
  }
  return absl::OkStatus();
}

}  // namespace tally
