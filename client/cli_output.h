// How glm-client prints wire messages: a readable text form and JSON, both listing every
// field (zeros, empty strings and false included, unlike protobuf's text format, which drops
// them: `layer_begin: 0` vanished from `info`). JSON keeps the proto's field names and prints
// 64-bit integers as numbers (proto3's canonical JSON quotes them), which is what jq expects.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace glmserve::cli {

// "name: value" lines, nested messages indented by two spaces under "name:", repeated
// fields as "[a, b]", enums by name. Bytes fields print their size only.
std::string MessageText(const google::protobuf::Message& message, int indent = 0);

// Every field, by proto field name. Bytes fields: their size ("<n bytes>").
nlohmann::json MessageJson(const google::protobuf::Message& message);

}  // namespace glmserve::cli
