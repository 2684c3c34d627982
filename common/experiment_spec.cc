#include "common/experiment_spec.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/spec_validation.h"
#include "common/spec_yaml.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"

namespace tally {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using tally::v1::ExperimentSpec;
using tally::v1::JobSpec;

constexpr char kValLossMetric[] = "val_loss";
constexpr char kQuantizedValLossMetric[] = "quantized_val_loss";

constexpr size_t kMaxDisplayNameChars = 200;
constexpr size_t kMaxListed = 20;

bool IsVariantNameChar(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' ||
         c == '_' || c == '-';
}

// "variants[2] (packed-moe)": the name as written when it is a valid one,
// else quoted and escaped.
std::string VariantLabel(const ExperimentSpec& spec, int index) {
  const std::string& name = spec.variants(index).name();
  std::string label = absl::StrCat("variants[", index, "]");
  if (name.empty()) return label;
  return absl::StrCat(label, " (",
                      IsVariantName(name) ? name : QuoteForMessage(name), ")");
}

// One message's problems, one by one. ValidateJobSpec's message joins
// problems that each start with "spec." with "; " (a problem's own text may
// hold "; ", never "; spec."), capped with "; and N more problems".
std::vector<std::string> SplitProblems(absl::string_view message) {
  std::vector<std::string> problems;
  for (absl::string_view part : absl::StrSplit(message, "; spec.")) {
    problems.push_back(problems.empty() ? std::string(part)
                                        : absl::StrCat("spec.", part));
  }
  return problems;
}

absl::Status ProblemsToStatus(const std::vector<std::string>& problems) {
  if (problems.empty()) return absl::OkStatus();
  if (problems.size() <= kMaxListed) {
    return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(problems.begin(), problems.begin() + kMaxListed, "; "),
      "; and ", problems.size() - kMaxListed, " more problems"));
}

const FieldDescriptor* FindField(const Message& m, const std::string& key) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const FieldDescriptor* f = d->FindFieldByName(key);
  return f != nullptr ? f : d->FindFieldByCamelcaseName(key);
}

// Replaces (or, for a map, merges by key) field `f` of `base` with that of
// `typed`: a copy of `typed` holding only `f`, merged in. MergeFrom appends
// lists and skips proto3 zero scalars, so the field is cleared first;
// it merges maps by key, which is the rule for maps.
void CopyField(const Message& typed, const FieldDescriptor* f, Message* base) {
  std::unique_ptr<Message> only(typed.New());
  only->CopyFrom(typed);
  std::vector<const FieldDescriptor*> set;
  only->GetReflection()->ListFields(*only, &set);
  for (const FieldDescriptor* g : set) {
    if (g != f) only->GetReflection()->ClearField(only.get(), g);
  }
  if (!f->is_map()) base->GetReflection()->ClearField(base, f);
  base->MergeFrom(*only);
}

// Merges `overrides` into `base` by the rules in the header. `typed` is
// `overrides` read into the same message type, so every key names a field
// and every value has its field's type.
void Merge(const google::protobuf::Struct& overrides, const Message& typed,
           Message* base) {
  const google::protobuf::Reflection* r = base->GetReflection();
  for (const auto& [key, value] : overrides.fields()) {
    const FieldDescriptor* f = FindField(*base, key);
    if (f == nullptr) continue;  // refused when `typed` was read
    if (value.kind_case() == google::protobuf::Value::kNullValue ||
        value.kind_case() == google::protobuf::Value::KIND_NOT_SET) {
      r->ClearField(base, f);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
               !f->is_repeated() &&
               value.kind_case() == google::protobuf::Value::kStructValue) {
      Merge(value.struct_value(), typed.GetReflection()->GetMessage(typed, f),
            r->MutableMessage(base, f));
    } else {
      CopyField(typed, f, base);
    }
  }
}

bool KnownMetric(absl::string_view metric) {
  return metric.empty() || metric == kValLossMetric || metric == kQuantizedValLossMetric;
}

// The experiment's target metric in the variant's spec: every variant's
// early stopping judges the loss the target is of (its target stop, its
// patience, its forecast), so with quantized_val_loss it needs a quantized
// evaluation, and a variant naming another metric is refused. False with
// the problems (prefixed with `label`) added.
bool ApplyTargetMetric(const ExperimentSpec& spec, const std::string& label, JobSpec* merged,
                       std::vector<std::string>* problems) {
  const std::string& target = spec.target().metric();
  if (!KnownMetric(target)) return true;  // ValidateExperimentSpec names it
  const std::string metric = target.empty() ? kValLossMetric : target;
  const std::string& own = merged->early_stopping().metric();
  bool ok = true;
  if (!own.empty() && own != metric) {
    problems->push_back(absl::StrCat(
        label, ": spec.early_stopping.metric: is ", QuoteForMessage(own),
        " but the experiment's target.metric is ", metric,
        ": a variant stops at the target by the loss the target is of; leave "
        "early_stopping.metric unset, or set target.metric: ", QuoteForMessage(own)));
    ok = false;
  }
  if (metric != kQuantizedValLossMetric) return ok;
  if (!merged->training().has_qat() && merged->training().eval_quantized().empty()) {
    problems->push_back(absl::StrCat(
        label, ": spec.training: target.metric quantized_val_loss needs a quantized "
        "evaluation in every variant: set training.qat (format q8_0 or q4_0) or "
        "training.eval_quantized in base, or in this variant's overrides"));
    return false;
  }
  if (ok) merged->mutable_early_stopping()->set_metric(metric);
  return ok;
}

// The variant's spec, or nullopt with its problems (prefixed) added.
std::optional<JobSpec> Resolve(const ExperimentSpec& spec, int index,
                               std::vector<std::string>* problems) {
  const std::string label = VariantLabel(spec, index);
  const google::protobuf::Struct& overrides = spec.variants(index).overrides();
  JobSpec merged = spec.base();
  if (absl::Status s = MergeOverrides(overrides, &merged, "spec"); !s.ok()) {
    problems->push_back(absl::StrCat(label, ": ", s.message()));
    return std::nullopt;
  }
  const bool metric_ok = ApplyTargetMetric(spec, label, &merged, problems);
  JobSpec prepared = merged;
  if (absl::Status s = PrepareJobSpec(&prepared); !s.ok()) {
    for (const std::string& problem : SplitProblems(s.message())) {
      problems->push_back(absl::StrCat(label, ": ", problem));
    }
    return std::nullopt;
  }
  if (!metric_ok) return std::nullopt;
  return merged;
}

}  // namespace

bool IsVariantName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxVariantNameChars) return false;
  for (char c : name) {
    if (!IsVariantNameChar(c)) return false;
  }
  return true;
}


absl::Status MergeOverrides(const google::protobuf::Struct& overrides,
                            Message* base, absl::string_view root) {
  std::unique_ptr<Message> typed(base->New());
  RETURN_IF_ERROR(ReadStructInto(overrides, typed.get(), root));
  Merge(overrides, *typed, base);
  return absl::OkStatus();
}

absl::StatusOr<ExperimentSpec> ParseExperimentYaml(absl::string_view text,
                                                   absl::string_view source) {
  ExperimentSpec spec;
  absl::Status s = ParseYamlInto(text, &spec, "");
  if (!s.ok()) {
    if (source.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  }
  return spec;
}

absl::StatusOr<JobSpec> ResolveVariant(const ExperimentSpec& spec, int index) {
  if (index < 0 || index >= spec.variants_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variants[", index, "]: no such variant; the experiment has ",
        spec.variants_size()));
  }
  std::vector<std::string> problems;
  std::optional<JobSpec> resolved = Resolve(spec, index, &problems);
  if (!resolved.has_value()) return ProblemsToStatus(problems);
  return *std::move(resolved);
}

void ApplyExperimentDefaults(ExperimentSpec* spec) {
  if (spec->strategy() == tally::v1::EXPERIMENT_STRATEGY_UNSPECIFIED) {
    spec->set_strategy(tally::v1::EXPERIMENT_STRATEGY_ALL);
  }
  if (spec->replicates() == 0) spec->set_replicates(1);
}

absl::Status ValidateExperimentSpec(const ExperimentSpec& spec) {
  std::vector<std::string> problems;
  auto add = [&](absl::string_view field, absl::string_view problem) {
    problems.push_back(absl::StrCat(field, ": ", problem));
  };

  if (std::optional<std::string> why = UnprintableReason(spec.display_name())) {
    add("display_name", *why);
  } else if (Utf8Length(spec.display_name()) > kMaxDisplayNameChars) {
    add("display_name",
        absl::StrCat("must be at most ", kMaxDisplayNameChars, " characters"));
  }

  const int n = spec.variants_size();
  if (n == 0) {
    add("variants", "at least one variant is needed");
  } else if (n > kMaxExperimentVariants) {
    add("variants",
        absl::StrCat("at most ", kMaxExperimentVariants, " variants, got ", n));
  }
  absl::flat_hash_map<std::string, int> index_of;
  for (int i = 0; i < n; ++i) {
    const std::string& name = spec.variants(i).name();
    const std::string field = absl::StrCat("variants[", i, "].name");
    if (name.empty()) {
      add(field, "is empty; name each variant");
    } else if (!IsVariantName(name)) {
      add(field, absl::StrCat(QuoteForMessage(name), " must be 1 to ",
                              kMaxVariantNameChars,
                              " characters of a-z, 0-9, '.', '_' and '-'"));
    } else if (auto [it, inserted] = index_of.emplace(name, i); !inserted) {
      add(field, absl::StrCat("\"", name, "\" is also the name of variants[",
                              it->second, "]; names must be unique"));
    }
  }

  if (spec.replicates() < 0 || spec.replicates() > kMaxExperimentReplicates) {
    add("replicates", absl::StrCat("must be 1 to ", kMaxExperimentReplicates,
                                   " (0: 1), got ", spec.replicates()));
  }

  const tally::v1::ExperimentTarget& target = spec.target();
  if (!KnownMetric(target.metric())) {
    add("target.metric",
        absl::StrCat("must be val_loss (the default) or quantized_val_loss, got ",
                     QuoteForMessage(target.metric())));
  }
  switch (target.target_case()) {
    case tally::v1::ExperimentTarget::TARGET_NOT_SET:
      add("target",
          "is not set; set target.from_variant to a variant's name or "
          "target.val_loss to a validation loss");
      break;
    case tally::v1::ExperimentTarget::kFromVariant:
      if (!index_of.contains(target.from_variant())) {
        std::vector<std::string> names;
        for (const auto& v : spec.variants()) {
          if (IsVariantName(v.name())) names.push_back(v.name());
        }
        add("target.from_variant",
            absl::StrCat(
                QuoteForMessage(target.from_variant()),
                " is not a variant; the variants are: ",
                names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
      }
      break;
    case tally::v1::ExperimentTarget::kValLoss:
      if (!std::isfinite(target.val_loss()) || target.val_loss() <= 0) {
        add("target.val_loss",
            absl::StrCat("must be a positive finite number, got ",
                         target.val_loss()));
      }
      break;
  }

  const double max_dollars = spec.budget().max_dollars();
  if (!std::isfinite(max_dollars) || max_dollars < 0) {
    add("budget.max_dollars",
        absl::StrCat("must be a finite number >= 0 (0: no budget), got ",
                     max_dollars));
  }

  const double rung_dollars = spec.rung_dollars();
  if (!std::isfinite(rung_dollars) || rung_dollars < 0) {
    add("rung_dollars",
        absl::StrCat("must be a finite number >= 0 (0: derived from the budget), got ",
                     rung_dollars));
  }

  switch (spec.strategy()) {
    case tally::v1::EXPERIMENT_STRATEGY_UNSPECIFIED:
    case tally::v1::EXPERIMENT_STRATEGY_ALL:
    case tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING:
      break;
    default:
      add("strategy", absl::StrCat("unknown value ", spec.strategy(),
                                   "; allowed: all, successive_halving"));
  }

  // Each variant is resolved even past the cap on variants, bounded by it:
  // its problems are reported above and the rest would only repeat them.
  for (int i = 0; i < std::min(n, kMaxExperimentVariants); ++i) {
    Resolve(spec, i, &problems);
  }
  return ProblemsToStatus(problems);
}

}  // namespace tally
