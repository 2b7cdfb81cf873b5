#include "server/wire_utf8.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/text/unicode.h"

namespace glmserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The wire types of the protobuf encoding.
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// One pass over the bytes of one top-level message. Offsets are into `wire_`, so errors name
// the byte of the whole request where the data breaks.
class Walker {
 public:
  Walker(const Descriptor& top, std::string_view wire) : top_(top), wire_(wire) {}

  absl::Status Run() {
    size_t pos = 0;
    return Message(&top_, &pos, wire_.size(), 0);
  }

 private:
  // Walks the fields in [*pos, end) of a `descriptor` message (nullptr: an unknown group's
  // contents, skipped field by field). A group ends at its end tag (`group` > 0: its field
  // number), a message exactly at `end`.
  absl::Status Message(const Descriptor* descriptor, size_t* pos, size_t end, int depth,
                       uint32_t group = 0) {
    while (*pos < end) {
      const size_t tag_at = *pos;
      uint64_t varint;
      if (!Varint(pos, end, &varint)) return Malformed(tag_at, "a truncated field tag");
      // As protobuf's parser reads a tag: at most 5 bytes, bits past 32 dropped (so that the
      // walk sees the field numbers the parse will see).
      const uint32_t tag = static_cast<uint32_t>(varint);
      if (*pos - tag_at > 5 || (tag >> 3) == 0) return Malformed(tag_at, "an invalid field tag");
      const uint32_t number = tag >> 3;
      switch (tag & 7) {
        case kVarint: {
          uint64_t ignored;
          if (!Varint(pos, end, &ignored)) return Malformed(tag_at, "a truncated varint");
          break;
        }
        case kFixed64:
          if (end - *pos < 8) return Malformed(tag_at, "a truncated fixed64");
          *pos += 8;
          break;
        case kFixed32:
          if (end - *pos < 4) return Malformed(tag_at, "a truncated fixed32");
          *pos += 4;
          break;
        case kLengthDelimited: {
          uint64_t length;
          if (!Varint(pos, end, &length)) return Malformed(tag_at, "a truncated length");
          if (length > end - *pos) {
            return Malformed(tag_at, absl::StrCat("a length (", length, ") past the end"));
          }
          const size_t begin = *pos;
          *pos += length;
          const FieldDescriptor* field =
              descriptor != nullptr ? descriptor->FindFieldByNumber(static_cast<int>(number))
                                    : nullptr;
          if (field == nullptr) break;  // unknown: kept unchecked, as protobuf does
          const bool text = field->type() == FieldDescriptor::TYPE_STRING;
          if (!text && field->type() != FieldDescriptor::TYPE_MESSAGE) break;
          int index = -1;
          if (field->is_repeated()) index = NextIndex(*field);
          path_.emplace_back(field, index);
          if (text) {
            const std::string_view value = wire_.substr(begin, length);
            // The field's name is built only for the error: most requests carry none.
            if (!ValidateUtf8(value, "").ok()) return ValidateUtf8(value, Path());
          } else {
            if (depth + 1 > kMaxWireDepth) return TooDeep(tag_at);
            size_t inner = begin;
            RETURN_IF_ERROR(Message(field->message_type(), &inner, *pos, depth + 1));
          }
          path_.pop_back();
          break;
        }
        case kStartGroup:
          // Only unknown fields can be groups here (the request schemas are proto3): their
          // contents are skipped, but their nesting is bounded and must balance.
          if (depth + 1 > kMaxWireDepth) return TooDeep(tag_at);
          RETURN_IF_ERROR(Message(nullptr, pos, end, depth + 1, number));
          break;
        case kEndGroup:
          if (group == number) return absl::OkStatus();
          return Malformed(tag_at, "an end-group tag without its start");
        default:
          return Malformed(tag_at, absl::StrCat("wire type ", tag & 7, ", which does not exist"));
      }
    }
    if (group != 0) return Malformed(end, absl::StrCat("group ", group, " never ends"));
    return absl::OkStatus();
  }

  // Reads a base-128 varint of at most 10 bytes from [*pos, end).
  bool Varint(size_t* pos, size_t end, uint64_t* value) const {
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *pos < end; shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(wire_[(*pos)++]);
      v |= uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80) == 0) {
        *value = v;
        return true;
      }
    }
    return false;
  }

  // The position of the next element of repeated `field` in the message path_ leads to. Kept
  // by path, not per occurrence: a singular message field sent twice is merged by protobuf, so
  // its repeated fields continue counting across the occurrences (as the parsed message has
  // them).
  int NextIndex(const FieldDescriptor& field) {
    std::string key;
    for (const auto& [f, index] : path_) absl::StrAppend(&key, f->number(), ":", index, "/");
    absl::StrAppend(&key, field.number());
    return next_index_[key]++;
  }

  // "messages[1].content": the fields from the top down to the one being checked.
  std::string Path() const {
    std::string out;
    for (const auto& [field, index] : path_) {
      if (!out.empty()) out += '.';
      out += field->name();
      if (index >= 0) absl::StrAppend(&out, "[", index, "]");
    }
    return out;
  }

  absl::Status Malformed(size_t at, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the request is not a valid %s: %s at byte %d of %d%s", top_.full_name(), what, at,
        wire_.size(), path_.empty() ? "" : absl::StrCat(" (inside ", Path(), ")")));
  }

  absl::Status TooDeep(size_t at) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("the request is not a valid %s: fields nested deeper than %d at byte %d",
                        top_.full_name(), kMaxWireDepth, at));
  }

  const Descriptor& top_;
  const std::string_view wire_;
  std::vector<std::pair<const FieldDescriptor*, int>> path_;  // -1: not repeated
  absl::flat_hash_map<std::string, int> next_index_;          // see NextIndex
};

}  // namespace

absl::Status CheckWireUtf8(const Descriptor& descriptor, std::string_view wire) {
  return Walker(descriptor, wire).Run();
}

absl::Status ParseCheckedMessage(std::string_view wire, google::protobuf::Message* message) {
  RETURN_IF_ERROR(CheckWireUtf8(*message->GetDescriptor(), wire));
  // Within the gRPC receive limit (an int) by construction; the check keeps the cast honest.
  if (wire.size() > static_cast<size_t>(INT32_MAX) ||
      !message->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                   message->GetDescriptor()->full_name(),
                                                   " (malformed protobuf wire data)"));
  }
  return absl::OkStatus();
}

}  // namespace glmserve
