#include "common/flag_env.h"

#include <cstdlib>

namespace tally {

EnvReader ProcessEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

bool FromEnv(const std::string& flag, const char* env, const EnvReader& read) {
  if (!flag.empty()) return false;
  const char* value = read(env);
  return value != nullptr && *value != '\0';
}

std::string FlagOrEnv(const std::string& flag, const char* env, const std::string& fallback,
                      const EnvReader& read) {
  if (!flag.empty()) return flag;
  return FromEnv(flag, env, read) ? std::string(read(env)) : fallback;
}

}  // namespace tally
