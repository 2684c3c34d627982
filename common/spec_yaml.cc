#include "common/spec_yaml.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/file/file_system.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/exceptions.h"
#include "yaml-cpp/mark.h"
#include "yaml-cpp/parser.h"

namespace tally {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One YAML value, built from the parser's events rather than as a YAML::Node:
// the builder sees every anchor, alias, key and nesting level before anything
// is allocated for it, so the limits in spec_yaml.h hold by construction.
struct Value {
  enum class Kind { kNull, kScalar, kSequence, kMap };
  Kind kind = Kind::kNull;
  int line = 0;  // 1-based; 0 when the parser gave no position
  std::string scalar;
  bool quoted = false;  // quoted or tagged ("8", !!str 8): text in a Struct
  // A sequence's items; a map's keys and values, alternating.
  std::vector<Value> children;
};

int LineOf(const YAML::Mark& mark) { return mark.line >= 0 ? mark.line + 1 : 0; }

std::string At(int line) {
  return line > 0 ? absl::StrCat(" (line ", line, ")") : std::string();
}

// Thrown by the builder to stop the parser at the first refusal.
struct Refusal {
  int line;
  std::string what;
};

class TreeBuilder : public YAML::EventHandler {
 public:
  // The document's root; null when the input holds no document.
  Value& root() { return root_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++num_documents_ > 1) {
      throw Refusal{LineOf(mark),
                    "a second YAML document starts here; a spec file holds "
                    "one job, so remove the \"---\" and what follows or "
                    "split it into one file per job"};
    }
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Add(mark, anchor, Value::Kind::kNull);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    throw Refusal{LineOf(mark),
                  "aliases (*name) are not allowed in a job spec; write the "
                  "value out"};
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag,
                YAML::anchor_t anchor, const std::string& value) override {
    Value* v = Add(mark, anchor, Value::Kind::kScalar);
    v->scalar = value;
    // yaml-cpp tags a plain untagged scalar "?"; quoted ones ("8") and
    // explicitly tagged ones (!!str 8) are kept as text in a Struct.
    v->quoted = tag != "?";
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&,
                       YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(Add(mark, anchor, Value::Kind::kSequence), mark);
  }
  void OnSequenceEnd() override { stack_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&,
                  YAML::anchor_t anchor, YAML::EmitterStyle::value) override {
    Open(Add(mark, anchor, Value::Kind::kMap), mark);
  }
  void OnMapEnd() override { stack_.pop_back(); }
  void OnAnchor(const YAML::Mark& mark, const std::string&) override {
    RefuseAnchor(mark);
  }

 private:
  [[noreturn]] static void RefuseAnchor(const YAML::Mark& mark) {
    throw Refusal{LineOf(mark),
                  "anchors (&name) and aliases (*name) are not allowed in a "
                  "job spec; write each value out"};
  }

  Value* Add(const YAML::Mark& mark, YAML::anchor_t anchor, Value::Kind kind) {
    if (anchor != YAML::NullAnchor) RefuseAnchor(mark);
    if (++num_values_ > kMaxSpecValues) {
      throw Refusal{LineOf(mark),
                    absl::StrCat("more than ", kMaxSpecValues,
                                 " values; a job spec has a few dozen")};
    }
    Value* v;
    if (stack_.empty()) {
      v = &root_;
    } else {
      Value* parent = stack_.back();
      const bool is_key = parent->kind == Value::Kind::kMap &&
                          parent->children.size() % 2 == 0;
      if (is_key && (kind == Value::Kind::kSequence ||
                     kind == Value::Kind::kMap)) {
        throw Refusal{LineOf(mark),
                      "a list or mapping is used as a key; keys are field "
                      "names"};
      }
      // Pointers on the stack are to ancestors, never to elements of this
      // vector, so growing it invalidates none of them.
      v = &parent->children.emplace_back();
    }
    v->kind = kind;
    v->line = LineOf(mark);
    return v;
  }

  void Open(Value* v, const YAML::Mark& mark) {
    if (static_cast<int>(stack_.size()) >= kMaxSpecDepth) {
      throw Refusal{LineOf(mark),
                    absl::StrCat("nested more than ", kMaxSpecDepth,
                                 " levels deep; a job spec has four")};
    }
    stack_.push_back(v);
  }

  Value root_;
  std::vector<Value*> stack_;
  int num_documents_ = 0;
  int num_values_ = 0;
};

absl::Status Bad(absl::string_view path, const Value& node,
                 absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, At(node.line), ": ", what));
}

absl::string_view KindName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNull:
      return "nothing";
    case Value::Kind::kScalar:
      return "a single value";
    case Value::Kind::kSequence:
      return "a list";
    case Value::Kind::kMap:
      return "a mapping";
  }
  return "?";
}

std::string FieldNames(const Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

std::string Quoted(absl::string_view s) { return QuoteForMessage(s); }

// A key as a field path component: as written when short, else quoted and cut.
std::string PathPart(absl::string_view key) {
  return key.size() <= 64 ? EscapeUnprintable(key) : QuoteForMessage(key);
}

// " (lines 3 and 5)"; empty for a tree read from a Struct, which has none.
std::string Lines(int first, int second) {
  if (first <= 0 || second <= 0) return std::string();
  return absl::StrCat(" (lines ", first, " and ", second, ")");
}

// `path`.`key`, or `key` alone under an empty root.
std::string FieldPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? PathPart(key) : absl::StrCat(path, ".", PathPart(key));
}

// Where a refusal of the whole input is: "spec (line 3)", or "line 3" under
// an empty root.
std::string Where(absl::string_view root, int line) {
  if (!root.empty()) return absl::StrCat(root, At(line));
  return line > 0 ? absl::StrCat("line ", line) : std::string("input");
}

// The shortest text that reads back as `v` (finite), integers without
// exponent up to 2^53.
std::string NumberText(double v) {
  if (std::fabs(v) <= 9007199254740992.0 && v == std::trunc(v)) {
    return absl::StrFormat("%.0f", v);
  }
  for (int precision = 1; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, v);
    double back;
    if (absl::SimpleAtod(text, &back) && back == v) return text;
  }
  return absl::StrFormat("%.17g", v);
}

absl::StatusOr<const EnumValueDescriptor*> ParseEnum(const EnumDescriptor* e,
                                                     const std::string& path,
                                                     const Value& node) {
  const std::string text = absl::AsciiStrToUpper(node.scalar);
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
             absl::StrCat("unknown value ", Quoted(node.scalar), "; allowed: ",
                          absl::StrJoin(allowed, ", ")));
}

absl::Status SetScalar(Message* msg, const FieldDescriptor* f,
                       const std::string& path, const Value& node) {
  if (node.kind != Value::Kind::kScalar) {
    return Bad(path, node,
               absl::StrCat("expected a single value, got ", KindName(node)));
  }
  const Reflection* r = msg->GetReflection();
  const std::string& s = node.scalar;
  const bool repeated = f->is_repeated();
  auto number_error = [&](absl::string_view kind) {
    return Bad(path, node, absl::StrCat("expected ", kind, ", got ", Quoted(s)));
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
        if (std::fabs(v) > FLT_MAX) return number_error("a number in float range");
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

// A mapping key as text; null keys and keys that are not text are refused.
absl::StatusOr<std::string> KeyText(const std::string& path, const Value& key) {
  if (key.kind != Value::Kind::kScalar) {
    return Bad(path, key, "a key is missing or empty; expected a name");
  }
  return key.scalar;
}

absl::Status ReadMessage(const Value& node, Message* msg,
                         const std::string& path);

// A YAML value as a google.protobuf.Value that keeps its text: a plain
// scalar is a bool or number only when it is written the way that value
// prints (true, 8, 2.5), so reading the Value back as a field gives what the
// text would have given; anything else is a string as written.
absl::Status ReadStructValue(const Value& node, const std::string& path,
                             google::protobuf::Value* out);

absl::Status ReadStruct(const Value& node, const std::string& path,
                        google::protobuf::Struct* out) {
  if (node.kind != Value::Kind::kMap) {
    return Bad(path, node,
               absl::StrCat("expected a mapping, got ", KindName(node)));
  }
  absl::flat_hash_map<std::string, int> seen;  // key -> line
  for (size_t i = 0; i + 1 < node.children.size(); i += 2) {
    const Value& key_node = node.children[i];
    ASSIGN_OR_RETURN(const std::string key, KeyText(path, key_node));
    const std::string field_path = FieldPath(path, key);
    if (auto [it, inserted] = seen.emplace(key, key_node.line); !inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_path, " (lines ", it->second, " and ",
                       key_node.line, "): given twice; keep one"));
    }
    RETURN_IF_ERROR(ReadStructValue(node.children[i + 1], field_path,
                                    &(*out->mutable_fields())[key]));
  }
  return absl::OkStatus();
}

absl::Status ReadStructValue(const Value& node, const std::string& path,
                             google::protobuf::Value* out) {
  switch (node.kind) {
    case Value::Kind::kNull:
      out->set_null_value(google::protobuf::NULL_VALUE);
      return absl::OkStatus();
    case Value::Kind::kMap:
      return ReadStruct(node, path, out->mutable_struct_value());
    case Value::Kind::kSequence: {
      google::protobuf::ListValue* list = out->mutable_list_value();
      for (size_t i = 0; i < node.children.size(); ++i) {
        RETURN_IF_ERROR(ReadStructValue(node.children[i],
                                        absl::StrCat(path, "[", i, "]"),
                                        list->add_values()));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kScalar:
      break;
  }
  const std::string& s = node.scalar;
  double number;
  if (!node.quoted && (s == "true" || s == "false")) {
    out->set_bool_value(s == "true");
  } else if (!node.quoted && absl::SimpleAtod(s, &number) &&
             std::isfinite(number) && NumberText(number) == s) {
    out->set_number_value(number);
  } else {
    out->set_string_value(s);
  }
  return absl::OkStatus();
}

absl::Status ReadField(const Value& value, Message* msg,
                       const FieldDescriptor* f, const std::string& path) {
  const Reflection* r = msg->GetReflection();
  if (f->is_map()) {
    if (value.kind != Value::Kind::kMap) {
      return Bad(path, value, "expected a mapping of key: value");
    }
    const FieldDescriptor* key_f = f->message_type()->map_key();
    const FieldDescriptor* val_f = f->message_type()->map_value();
    absl::flat_hash_map<std::string, int> seen;  // key -> line
    for (size_t i = 0; i + 1 < value.children.size(); i += 2) {
      const Value& key_node = value.children[i];
      const Value& val_node = value.children[i + 1];
      ASSIGN_OR_RETURN(const std::string key, KeyText(path, key_node));
      const std::string entry_path =
          absl::StrCat(path, "[", Quoted(key), "]");
      if (auto [it, inserted] = seen.emplace(key, key_node.line); !inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(entry_path, " (lines ", it->second, " and ",
                         key_node.line, "): the key is given twice; keep one"));
      }
      Message* entry = r->AddMessage(msg, f);
      RETURN_IF_ERROR(SetScalar(entry, key_f, entry_path, key_node));
      if (val_f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        RETURN_IF_ERROR(ReadMessage(
            val_node, entry->GetReflection()->MutableMessage(entry, val_f),
            entry_path));
      } else {
        RETURN_IF_ERROR(SetScalar(entry, val_f, entry_path, val_node));
      }
    }
    return absl::OkStatus();
  }
  if (f->is_repeated()) {
    if (value.kind != Value::Kind::kSequence) {
      return Bad(path, value, "expected a list");
    }
    for (size_t i = 0; i < value.children.size(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        RETURN_IF_ERROR(
            ReadMessage(value.children[i], r->AddMessage(msg, f), item_path));
      } else {
        RETURN_IF_ERROR(SetScalar(msg, f, item_path, value.children[i]));
      }
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return ReadMessage(value, r->MutableMessage(msg, f), path);
  }
  return SetScalar(msg, f, path, value);
}

absl::Status ReadMessage(const Value& node, Message* msg,
                         const std::string& path) {
  if (node.kind == Value::Kind::kNull) return absl::OkStatus();
  const Descriptor* d = msg->GetDescriptor();
  if (d->well_known_type() == Descriptor::WELLKNOWNTYPE_STRUCT) {
    google::protobuf::Struct data;
    RETURN_IF_ERROR(ReadStruct(node, path, &data));
    msg->CopyFrom(data);
    return absl::OkStatus();
  }
  if (node.kind != Value::Kind::kMap) {
    return Bad(path, node,
               absl::StrCat("expected a mapping with fields: ", FieldNames(d)));
  }
  struct Seen {
    std::string key;
    int line;
  };
  absl::flat_hash_map<const FieldDescriptor*, Seen> seen;
  absl::flat_hash_map<const google::protobuf::OneofDescriptor*, Seen>
      seen_oneofs;
  for (size_t i = 0; i + 1 < node.children.size(); i += 2) {
    const Value& key_node = node.children[i];
    const Value& val_node = node.children[i + 1];
    ASSIGN_OR_RETURN(const std::string key, KeyText(path, key_node));
    const std::string field_path = FieldPath(path, key);
    const FieldDescriptor* f = d->FindFieldByName(key);
    if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
    if (f == nullptr) {
      return Bad(field_path, key_node,
                 absl::StrCat("unknown field; ", d->name(),
                              " has: ", FieldNames(d)));
    }
    if (auto [it, inserted] = seen.emplace(f, Seen{key, key_node.line});
        !inserted) {
      const Seen& first = it->second;
      const std::string lines =
          absl::StrCat(Lines(first.line, key_node.line), ": ");
      if (first.key == key) {
        return absl::InvalidArgumentError(
            absl::StrCat(field_path, lines, "given twice; keep one"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          FieldPath(path, f->name()), lines, Quoted(first.key), " and ",
          Quoted(key), " name the same field; keep one"));
    }
    if (const google::protobuf::OneofDescriptor* o = f->real_containing_oneof();
        o != nullptr) {
      if (auto [it, inserted] =
              seen_oneofs.emplace(o, Seen{key, key_node.line});
          !inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            field_path, Lines(it->second.line, key_node.line), ": ",
            Quoted(it->second.key), " and ", Quoted(key),
            " are alternatives; keep one"));
      }
    }
    if (val_node.kind == Value::Kind::kNull) continue;
    RETURN_IF_ERROR(ReadField(val_node, msg, f, field_path));
  }
  return absl::OkStatus();
}

// A Struct as the Value tree ParseYamlInto reads (no lines), under the same
// limits, since it may come from anywhere.
absl::Status StructToTree(const google::protobuf::Value& v, int depth,
                          int* num_values, Value* out) {
  if (++*num_values > kMaxSpecValues) {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", kMaxSpecValues, " values"));
  }
  if (depth > kMaxSpecDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("nested more than ", kMaxSpecDepth, " levels deep"));
  }
  switch (v.kind_case()) {
    case google::protobuf::Value::kNullValue:
    case google::protobuf::Value::KIND_NOT_SET:
      out->kind = Value::Kind::kNull;
      break;
    case google::protobuf::Value::kBoolValue:
      out->kind = Value::Kind::kScalar;
      out->scalar = v.bool_value() ? "true" : "false";
      break;
    case google::protobuf::Value::kNumberValue:
      out->kind = Value::Kind::kScalar;
      // Not finite: left as text, which every numeric field refuses.
      out->scalar = std::isfinite(v.number_value())
                        ? NumberText(v.number_value())
                        : absl::StrCat(v.number_value());
      break;
    case google::protobuf::Value::kStringValue:
      out->kind = Value::Kind::kScalar;
      out->scalar = v.string_value();
      out->quoted = true;
      break;
    case google::protobuf::Value::kListValue:
      out->kind = Value::Kind::kSequence;
      for (const google::protobuf::Value& item : v.list_value().values()) {
        RETURN_IF_ERROR(StructToTree(item, depth + 1, num_values,
                                     &out->children.emplace_back()));
      }
      break;
    case google::protobuf::Value::kStructValue: {
      out->kind = Value::Kind::kMap;
      // Sorted, so the first error reported does not depend on map order.
      std::vector<const std::string*> keys;
      for (const auto& [key, unused] : v.struct_value().fields()) {
        keys.push_back(&key);
      }
      std::sort(keys.begin(), keys.end(),
                [](const std::string* a, const std::string* b) {
                  return *a < *b;
                });
      for (const std::string* key : keys) {
        Value& key_value = out->children.emplace_back();
        key_value.kind = Value::Kind::kScalar;
        key_value.scalar = *key;
        RETURN_IF_ERROR(StructToTree(v.struct_value().fields().at(*key),
                                     depth + 1, num_values,
                                     &out->children.emplace_back()));
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Prefixed(absl::string_view source, absl::Status status) {
  if (status.ok() || source.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(source, ": ", status.message()));
}

}  // namespace

absl::Status ParseYamlInto(absl::string_view text, Message* message,
                           absl::string_view root) {
  if (text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(root, 0), ": the input is larger than ", kMaxSpecBytes / 1024,
        " KiB; a job spec is a few hundred bytes"));
  }
  TreeBuilder builder;
  try {
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(builder)) {
    }
  } catch (const Refusal& r) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(root, r.line), ": ", r.what));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(root, 0), ": not valid YAML", At(LineOf(e.mark)),
                     ": ", EscapeUnprintable(e.msg)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(root, 0), ": could not be read as YAML: ",
                     EscapeUnprintable(e.what())));
  }
  return ReadMessage(builder.root(), message, std::string(root));
}

absl::Status ReadStructInto(const google::protobuf::Struct& data,
                            Message* message, absl::string_view root) {
  google::protobuf::Value whole;
  *whole.mutable_struct_value() = data;
  Value tree;
  int num_values = 0;
  if (absl::Status s = StructToTree(whole, 0, &num_values, &tree); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(root, 0), ": ", s.message()));
  }
  return ReadMessage(tree, message, std::string(root));
}

absl::StatusOr<tally::v1::JobSpec> ParseJobSpecYaml(absl::string_view text,
                                                    absl::string_view source) {
  tally::v1::JobSpec spec;
  RETURN_IF_ERROR(Prefixed(source, ParseYamlInto(text, &spec)));
  return spec;
}

absl::StatusOr<tally::v1::JobSpec> ReadJobSpecStream(std::istream& in,
                                                     absl::string_view source) {
  // One byte past the limit tells a too-long input from one at the limit,
  // without reading an endless one (/dev/zero) to its end.
  absl::StatusOr<std::string> read = file::ReadAtMost(in, kMaxSpecBytes);
  if (!read.ok()) {
    return Prefixed(source, absl::InvalidArgumentError("cannot be read"));
  }
  const std::string& text = *read;
  if (text.size() > kMaxSpecBytes) {
    return Prefixed(source, absl::InvalidArgumentError(absl::StrCat(
                                "is larger than ", kMaxSpecBytes / 1024,
                                " KiB; a job spec is a few hundred bytes")));
  }
  return ParseJobSpecYaml(text, source);
}

absl::StatusOr<tally::v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", EscapeUnprintable(path)));
  }
  return ReadJobSpecStream(in, EscapeUnprintable(path));
}

}  // namespace tally
