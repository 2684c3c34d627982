#include "cli/tallyctl/token_commands.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "cli/tallyctl/client_config.h"
#include "cli/tallyctl/exit_codes.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/output.h"
#include "cli/tallyctl/tokens.h"

namespace tally::cli {
namespace {

// A fresh token and the entry of tallyd's token file that admits it.
int TokenCreate() {
  TokenEntry entry{.name = absl::GetFlag(FLAGS_name),
                   .tenant = absl::GetFlag(FLAGS_tenant),
                   .role = absl::GetFlag(FLAGS_role)};
  if (absl::Status s = ValidateTokenEntry(entry); !s.ok()) {
    std::cerr << "tallyctl token create: " << s.message() << "\n";
    return kUsage;
  }
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) {
    std::cerr << "tallyctl token create: " << token.status().message() << "\n";
    return kError;
  }
  entry.token_sha256 = TokenSha256Hex(*token);
  if (absl::GetFlag(FLAGS_output) == "json") {
    // Every value is a checked plain word or hex: nothing to escape.
    std::cout << "{\n  \"token\": \"" << *token << "\",\n  \"entry\": {\n    \"name\": \""
              << entry.name << "\",\n    \"tenant\": \"" << entry.tenant
              << "\",\n    \"role\": \"" << entry.role << "\",\n    \"token_sha256\": \""
              << entry.token_sha256 << "\"\n  }\n}\n";
  } else {
    std::cout << *token << "\n" << TokenEntryYaml(entry) << "\n";
  }
  return kOk;
}

// The SHA-256 of the token on stdin (surrounding whitespace ignored), as
// tallyd's token file holds it.
int TokenHash() {
  std::string text(kMaxTokenBytes + 65, '\0');
  std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(std::cin.gcount()));
  const std::string token(absl::StripAsciiWhitespace(text));
  if (absl::Status s = CheckToken(token, "stdin"); !s.ok()) {
    std::cerr << "tallyctl token hash: " << s.message() << "\n";
    return kUsage;
  }
  const std::string sha = TokenSha256Hex(token);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << "{\n  \"token_sha256\": \"" << sha << "\"\n}\n";
  } else {
    std::cout << sha << "\n";
  }
  return kOk;
}

}  // namespace

int Token(const std::vector<char*>& args) {
  const std::string sub = args.size() > 2 ? args[2] : "";
  if (args.size() > 3) {
    std::cerr << "tallyctl token " << Safe(sub)
              << ": takes no arguments (flags: --name, --tenant, --role)\n";
    return kUsage;
  }
  if (sub == "create") return TokenCreate();
  if (sub == "hash") return TokenHash();
  std::cerr << "tallyctl token: unknown or missing subcommand \"" << Safe(sub)
            << "\"; use create or hash\n";
  return kUsage;
}

}  // namespace tally::cli
