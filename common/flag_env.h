// The one way a main reads a setting that has a flag and an environment
// variable: the flag when it is set, else the variable when it is set and
// not empty, else the default. Shared by tally-worker, tallyctl and the
// tools, so "--x, else $TALLY_X, else ..." means the same everywhere.
#ifndef TALLY_COMMON_FLAG_ENV_H_
#define TALLY_COMMON_FLAG_ENV_H_

#include <functional>
#include <string>

namespace tally {

// Reads an environment variable: null when unset (std::getenv by default;
// tests pass a table).
using EnvReader = std::function<const char*(const char*)>;
EnvReader ProcessEnv();

// `flag` when not empty, else $`env` when set and not empty, else
// `fallback`.
std::string FlagOrEnv(const std::string& flag, const char* env,
                      const std::string& fallback = "", const EnvReader& read = ProcessEnv());

// Whether the value FlagOrEnv returns comes from $`env`.
bool FromEnv(const std::string& flag, const char* env, const EnvReader& read = ProcessEnv());

}  // namespace tally

#endif  // TALLY_COMMON_FLAG_ENV_H_
