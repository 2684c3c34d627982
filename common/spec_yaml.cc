#include "common/spec_yaml.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "yaml-cpp/yaml.h"

namespace tally {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status Bad(absl::string_view path, const YAML::Node& node,
                 absl::string_view what) {
  std::string where;
  if (node.Mark().line >= 0) where = absl::StrCat(" (line ", node.Mark().line + 1, ")");
  return absl::InvalidArgumentError(absl::StrCat(path, where, ": ", what));
}

std::string FieldNames(const Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<const EnumValueDescriptor*> ParseEnum(const EnumDescriptor* e,
                                                     const std::string& path,
                                                     const YAML::Node& node) {
  const std::string text = absl::AsciiStrToUpper(node.Scalar());
  std::vector<std::string> allowed;
  // Short names drop the common prefix: PRECISION_FP8 -> FP8.
  const std::string prefix = e->value_count() > 0
                                 ? e->value(0)->name().substr(
                                       0, e->value(0)->name().rfind("UNSPECIFIED"))
                                 : "";
  for (int i = 0; i < e->value_count(); ++i) {
    const EnumValueDescriptor* v = e->value(i);
    if (v->number() == 0) continue;
    std::string short_name = v->name();
    if (!prefix.empty() && short_name.rfind(prefix, 0) == 0) {
      short_name = short_name.substr(prefix.size());
    }
    if (text == v->name() || text == short_name) return v;
    allowed.push_back(absl::AsciiStrToLower(short_name));
  }
  return Bad(path, node,
             absl::StrCat("unknown value \"", node.Scalar(), "\"; allowed: ",
                          absl::StrJoin(allowed, ", ")));
}

absl::Status SetScalar(Message* msg, const FieldDescriptor* f,
                       const std::string& path, const YAML::Node& node) {
  if (!node.IsScalar()) {
    return Bad(path, node, "expected a single value, got a list or mapping");
  }
  const Reflection* r = msg->GetReflection();
  const std::string& s = node.Scalar();
  const bool repeated = f->is_repeated();
  auto number_error = [&](absl::string_view kind) {
    return Bad(path, node,
               absl::StrCat("expected ", kind, ", got \"", s, "\""));
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v;
      if (!absl::SimpleAtoi(s, &v)) return number_error("an integer");
      repeated ? r->AddInt32(msg, f, v) : r->SetInt32(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(s, &v)) return number_error("an integer");
      repeated ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v;
      if (!absl::SimpleAtoi(s, &v)) return number_error("a non-negative integer");
      repeated ? r->AddUInt32(msg, f, v) : r->SetUInt32(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(s, &v)) return number_error("a non-negative integer");
      repeated ? r->AddUInt64(msg, f, v) : r->SetUInt64(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v;
      if (!absl::SimpleAtod(s, &v) || !std::isfinite(v)) {
        return number_error("a finite number");
      }
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        repeated ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
      } else {
        repeated ? r->AddFloat(msg, f, static_cast<float>(v))
                 : r->SetFloat(msg, f, static_cast<float>(v));
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v;
      if (!absl::SimpleAtob(s, &v)) return number_error("true or false");
      repeated ? r->AddBool(msg, f, v) : r->SetBool(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      repeated ? r->AddString(msg, f, s) : r->SetString(msg, f, s);
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      ASSIGN_OR_RETURN(const EnumValueDescriptor* v,
                       ParseEnum(f->enum_type(), path, node));
      repeated ? r->AddEnum(msg, f, v) : r->SetEnum(msg, f, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return Bad(path, node, "expected a mapping");
  }
  return absl::OkStatus();
}

absl::Status ReadMessage(const YAML::Node& node, Message* msg,
                         const std::string& path);

absl::Status ReadField(const YAML::Node& value, Message* msg,
                       const FieldDescriptor* f, const std::string& path) {
  const Reflection* r = msg->GetReflection();
  if (f->is_map()) {
    if (!value.IsMap()) return Bad(path, value, "expected a mapping of key: value");
    const FieldDescriptor* key_f = f->message_type()->map_key();
    const FieldDescriptor* val_f = f->message_type()->map_value();
    for (const auto& kv : value) {
      const std::string key = kv.first.as<std::string>();
      const std::string entry_path = absl::StrCat(path, "[\"", key, "\"]");
      Message* entry = r->AddMessage(msg, f);
      RETURN_IF_ERROR(SetScalar(entry, key_f, entry_path, kv.first));
      if (val_f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        RETURN_IF_ERROR(ReadMessage(
            kv.second, entry->GetReflection()->MutableMessage(entry, val_f),
            entry_path));
      } else {
        RETURN_IF_ERROR(SetScalar(entry, val_f, entry_path, kv.second));
      }
    }
    return absl::OkStatus();
  }
  if (f->is_repeated()) {
    if (!value.IsSequence()) return Bad(path, value, "expected a list");
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        RETURN_IF_ERROR(ReadMessage(value[i], r->AddMessage(msg, f), item_path));
      } else {
        RETURN_IF_ERROR(SetScalar(msg, f, item_path, value[i]));
      }
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return ReadMessage(value, r->MutableMessage(msg, f), path);
  }
  return SetScalar(msg, f, path, value);
}

absl::Status ReadMessage(const YAML::Node& node, Message* msg,
                         const std::string& path) {
  if (node.IsNull()) return absl::OkStatus();
  const Descriptor* d = msg->GetDescriptor();
  if (!node.IsMap()) {
    return Bad(path, node,
               absl::StrCat("expected a mapping with fields: ", FieldNames(d)));
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string field_path = absl::StrCat(path, ".", key);
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
    if (f == nullptr) {
      return Bad(field_path, kv.first,
                 absl::StrCat("unknown field; ", d->name(),
                              " has: ", FieldNames(d)));
    }
    if (kv.second.IsNull()) continue;
    RETURN_IF_ERROR(ReadField(kv.second, msg, f, field_path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseYamlInto(absl::string_view text, Message* message,
                           absl::string_view root) {
  YAML::Node node;
  try {
    node = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        root, ": not valid YAML (line ", e.mark.line + 1, "): ", e.msg));
  }
  try {
    return ReadMessage(node, message, std::string(root));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(root, ": line ", e.mark.line + 1, ": ", e.msg));
  }
}

absl::StatusOr<tally::v1::JobSpec> ParseJobSpecYaml(absl::string_view text) {
  tally::v1::JobSpec spec;
  RETURN_IF_ERROR(ParseYamlInto(text, &spec));
  return spec;
}

absl::StatusOr<tally::v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  absl::StatusOr<tally::v1::JobSpec> spec = ParseJobSpecYaml(buf.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace tally
