// The one way a main reads a setting that has a flag and an environment
// variable: the flag when it is set, else the variable when it is set and
// not empty, else the default. Shared by tally-worker, tallyd and tallyctl
// (whose config-file resolution reads the environment through the same
// Environment), so "--x, else $TALLY_X, else ..." means the same everywhere.
#ifndef TALLY_COMMON_FLAG_ENV_H_
#define TALLY_COMMON_FLAG_ENV_H_

#include <functional>
#include <optional>
#include <string>

namespace tally {

// An environment variable's value; nullopt when it is unset. Tests pass a
// table; an empty value counts as unset wherever a value is chosen.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;

// The process's own environment (getenv).
Environment ProcessEnvironment();

// `flag` when not empty, else $`env` when set and not empty, else
// `fallback`.
std::string FlagOrEnv(const std::string& flag, const std::string& env,
                      const std::string& fallback = "",
                      const Environment& read = ProcessEnvironment());

// Whether FlagOrEnv's value comes from $`env`: `flag` is empty and $`env`
// is set and not empty.
bool FromEnv(const std::string& flag, const std::string& env,
             const Environment& read = ProcessEnvironment());

}  // namespace tally

#endif  // TALLY_COMMON_FLAG_ENV_H_
