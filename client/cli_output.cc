#include "client/cli_output.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"

namespace glmserve::cli {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One scalar value (element `index` of a repeated field, or the field when index < 0).
nlohmann::json ScalarJson(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string value = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES)
        return absl::StrCat("<", value.size(), " bytes>");
      return value;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

std::string ScalarText(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

}  // namespace

nlohmann::json MessageJson(const Message& message) {
  nlohmann::json out = nlohmann::json::object();
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      nlohmann::json list = nlohmann::json::array();
      for (int j = 0; j < r->FieldSize(message, f); ++j) list.push_back(ScalarJson(message, f, j));
      out[f->name()] = std::move(list);
    } else {
      out[f->name()] = ScalarJson(message, f, -1);
    }
  }
  return out;
}

std::string MessageText(const Message& message, int indent) {
  const std::string pad(indent, ' ');
  std::string out;
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      absl::StrAppend(&out, pad, f->name(), ":\n",
                      MessageText(r->GetMessage(message, f), indent + 2));
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      for (int j = 0; j < r->FieldSize(message, f); ++j) {
        absl::StrAppend(&out, pad, f->name(), "[", j, "]:\n",
                        MessageText(r->GetRepeatedMessage(message, f, j), indent + 2));
      }
    } else if (f->is_repeated()) {
      std::vector<std::string> items;
      for (int j = 0; j < r->FieldSize(message, f); ++j) {
        items.push_back(ScalarText(ScalarJson(message, f, j)));
      }
      absl::StrAppend(&out, pad, f->name(), ": [", absl::StrJoin(items, ", "), "]\n");
    } else {
      absl::StrAppend(&out, pad, f->name(), ": ", ScalarText(ScalarJson(message, f, -1)), "\n");
    }
  }
  return out;
}

}  // namespace glmserve::cli
