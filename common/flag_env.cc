#include "common/flag_env.h"

#include <cstdlib>

namespace tally {

Environment ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

bool FromEnv(const std::string& flag, const std::string& env, const Environment& read) {
  if (!flag.empty()) return false;
  const std::optional<std::string> value = read(env);
  return value.has_value() && !value->empty();
}

std::string FlagOrEnv(const std::string& flag, const std::string& env,
                      const std::string& fallback, const Environment& read) {
  if (!flag.empty()) return flag;
  const std::optional<std::string> value = read(env);
  return value.has_value() && !value->empty() ? *value : fallback;
}

}  // namespace tally
