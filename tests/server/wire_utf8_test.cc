// server/wire_utf8.h: the descriptor-driven walk that checks request text on the wire bytes.
// Every string field reachable from the raw methods' requests is covered by construction
// (the cases are derived from the descriptors), valid text (4-byte UTF-8 included) parses as
// protobuf parses it, unknown fields are skipped, and broken wire data is INVALID_ARGUMENT.
#include "server/wire_utf8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glmserve/v1/glmserve.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "inference/grpc_service.pb.h"
#include "tests/server/wire_encode.h"

namespace glmserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using testing::kBadUtf8;
using testing::WireInt;
using testing::WireLen;
using testing::WireTag;
using testing::WireVarint;

// One string field reached from a top-level message: its wire encoding holding `value`
// (each enclosing message encoded around it) and the path an error must name.
struct StringField {
  std::string path;
  std::function<std::string(const std::string&)> encode;
};

void CollectStringFields(const Descriptor& d, const std::string& prefix,
                         const std::function<std::string(const std::string&)>& wrap, int depth,
                         std::vector<StringField>* out) {
  ASSERT_LT(depth, 8) << "a recursive request schema: bound this walk";
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor* f = d.field(i);
    const std::string name =
        absl::StrCat(prefix, prefix.empty() ? "" : ".", f->name(), f->is_repeated() ? "[0]" : "");
    const uint32_t number = static_cast<uint32_t>(f->number());
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      out->push_back(
          {name, [wrap, number](const std::string& v) { return wrap(WireLen(number, v)); }});
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      CollectStringFields(
          *f->message_type(), name,
          [wrap, number](const std::string& inner) { return wrap(WireLen(number, inner)); },
          depth + 1, out);
    }
  }
}

std::vector<StringField> StringFields(const Descriptor& d) {
  std::vector<StringField> out;
  CollectStringFields(
      d, "", [](const std::string& s) { return s; }, 0, &out);
  return out;
}

TEST(WireUtf8Test, EveryStringFieldOfTheRawRequestsIsCheckedAndNamed) {
  int fields = 0;
  for (const Descriptor* d :
       {v1::GenerateRequest::descriptor(), v1::ForwardRequest::descriptor(),
        v1::TokenizeRequest::descriptor(), v1::CloseSessionRequest::descriptor()}) {
    for (const StringField& f : StringFields(*d)) {
      ++fields;
      // Valid text, 4-byte UTF-8 included, passes and parses as protobuf parses it.
      const std::string good = f.encode("caf\xC3\xA9 \xE5\xAD\x97 \xF0\x9F\x98\x80");
      EXPECT_TRUE(CheckWireUtf8(*d, good).ok()) << f.path;
      const absl::Status bad = CheckWireUtf8(*d, f.encode(kBadUtf8));
      EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << f.path;
      EXPECT_EQ(bad.message(),
                absl::StrCat(f.path,
                             " is not valid UTF-8: an ill-formed sequence starts with "
                             "byte 0xFF at offset 3"))
          << f.path;
    }
  }
  // Generate 11 (with the chat message's 5), Forward 2, Tokenize 7, CloseSession 1: a schema
  // change shows here (a new field is covered by construction; a dropped one should be noticed).
  EXPECT_EQ(fields, 21);
  std::vector<std::string> paths;
  for (const StringField& f : StringFields(*v1::GenerateRequest::descriptor())) {
    paths.push_back(f.path);
  }
  // The KServe service's raw requests: map entries too (`parameters[0].value.string_param`).
  for (const Descriptor* d :
       {inference::ModelInferRequest::descriptor(), inference::ModelReadyRequest::descriptor(),
        inference::ModelMetadataRequest::descriptor()}) {
    for (const StringField& f : StringFields(*d)) {
      EXPECT_TRUE(CheckWireUtf8(*d, f.encode("\xF0\x9F\x98\x80")).ok()) << f.path;
      EXPECT_TRUE(absl::StartsWith(CheckWireUtf8(*d, f.encode(kBadUtf8)).message(),
                                   f.path + " is not valid UTF-8"))
          << f.path;
    }
  }
  for (const char* p : {"prompt_text", "messages[0].role", "messages[0].content",
                        "messages[0].reasoning_content", "messages[0].tool_calls[0].name",
                        "messages[0].tool_calls[0].arguments_json", "stop.stop_strings[0]",
                        "tools_json[0]", "tool_choice", "tool_choice_function", "request_id"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), p), paths.end()) << p;
  }
}

TEST(WireUtf8Test, RepeatedIndicesCountAsTheParsedMessageHasThem) {
  // messages[0] fine, messages[1].content bad; other fields between the two.
  std::string wire = WireLen(7, WireLen(1, "user") + WireLen(2, "hi")) + WireInt(11, 1) +
                     WireLen(8, "{}") + WireLen(7, WireLen(1, "assistant") + WireLen(2, kBadUtf8));
  absl::Status s = CheckWireUtf8(*v1::GenerateRequest::descriptor(), wire);
  EXPECT_TRUE(absl::StartsWith(s.message(), "messages[1].content is not valid UTF-8")) << s;
  // `stop` sent twice is one merged message: its stop strings keep counting (index 2).
  wire = WireLen(3, WireLen(4, "a") + WireLen(4, "b")) + WireLen(3, WireLen(4, kBadUtf8));
  s = CheckWireUtf8(*v1::GenerateRequest::descriptor(), wire);
  EXPECT_TRUE(absl::StartsWith(s.message(), "stop.stop_strings[2] is not valid UTF-8")) << s;
  // Tool calls inside the second message.
  wire = WireLen(7, WireLen(2, "x")) +
         WireLen(7, WireLen(4, WireLen(1, "f")) + WireLen(4, WireLen(2, kBadUtf8)));
  s = CheckWireUtf8(*v1::GenerateRequest::descriptor(), wire);
  EXPECT_TRUE(absl::StartsWith(s.message(), "messages[1].tool_calls[1].arguments_json is not"))
      << s;
}

TEST(WireUtf8Test, ValidRequestsParseExactlyAsProtobufParsesThem) {
  v1::GenerateRequest request;
  request.set_request_id("r-1");
  request.set_prompt_text("Hello \xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD");
  request.add_prompt_token_ids(3);
  v1::ChatMessage* m = request.add_messages();
  m->set_role("assistant");
  m->set_content("\xF0\x90\x8D\x88");  // U+10348, 4 bytes
  m->add_tool_calls()->set_name("get_weather");
  request.mutable_stop()->add_stop_strings("\xF0\x9F\x9B\x91");
  request.add_tools_json(R"({"type": "function"})");
  request.mutable_sampling()->set_temperature(0.5f);
  const std::string wire = request.SerializeAsString();
  v1::GenerateRequest parsed;
  parsed.set_request_id("stale");  // cleared by the parse
  ASSERT_TRUE(ParseCheckedMessage(wire, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, request));
  // The empty message is valid.
  EXPECT_TRUE(ParseCheckedMessage("", &parsed).ok());
  EXPECT_EQ(parsed.ByteSizeLong(), 0u);
}

TEST(WireUtf8Test, UnknownFieldsAreSkippedUnchecked) {
  // Field 99 (unknown) may hold anything, as protobuf keeps unknown fields unchecked; a known
  // string field sent with another wire type is unknown to protobuf too.
  const std::string wire = WireLen(99, kBadUtf8) + WireInt(6, 7) + WireTag(98, 3) +
                           WireLen(1, kBadUtf8) + WireTag(98, 4) + WireLen(6, "fine");
  v1::GenerateRequest parsed;
  const absl::Status s = ParseCheckedMessage(wire, &parsed);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(parsed.prompt_text(), "fine");
  EXPECT_TRUE(parsed.ParseFromString(wire));  // protobuf agrees
}

TEST(WireUtf8Test, TagsAreReadAsProtobufReadsThem) {
  // A 5-byte tag's bits past 32 are dropped by protobuf's parser: this is prompt_text (6).
  const std::string tag = WireVarint((uint64_t{7} << 32) | (6 << 3) | 2);
  ASSERT_EQ(tag.size(), 5u);
  v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseCheckedMessage(tag + WireVarint(2) + "hi", &parsed).ok());
  EXPECT_EQ(parsed.prompt_text(), "hi");
  EXPECT_TRUE(absl::StartsWith(
      CheckWireUtf8(*v1::GenerateRequest::descriptor(), tag + WireVarint(9) + kBadUtf8).message(),
      "prompt_text is not valid UTF-8"));
}

TEST(WireUtf8Test, ProtobufItselfRefusesWhatTheWalkNames) {
  // Why the walk exists: protobuf's parser fails the whole message, naming nothing.
  const std::string wire = WireLen(6, kBadUtf8);
  v1::GenerateRequest parsed;
  EXPECT_FALSE(parsed.ParseFromString(wire));
  EXPECT_EQ(ParseCheckedMessage(wire, &parsed).message(),
            "prompt_text is not valid UTF-8: an ill-formed sequence starts with byte 0xFF at "
            "offset 3");
}

TEST(WireUtf8Test, MalformedWireDataIsRefusedNamingTheByte) {
  const Descriptor& d = *v1::GenerateRequest::descriptor();
  const struct {
    const char* name;
    std::string wire;
    const char* expect;
  } cases[] = {
      {"truncated tag", std::string("\x80", 1), "a truncated field tag at byte 0 of 1"},
      {"field number 0", WireTag(0, 0) + WireVarint(1), "an invalid field tag at byte 0"},
      {"6-byte tag", WireVarint(uint64_t{1} << 40), "an invalid field tag"},
      {"wire type 7", WireTag(6, 7), "wire type 7, which does not exist"},
      {"truncated varint", WireTag(1, 0) + std::string("\xff\xff", 2), "a truncated varint"},
      {"11-byte varint", WireTag(1, 0) + std::string(10, '\xff') + "\x01", "a truncated varint"},
      {"truncated fixed64", WireTag(50, 1) + "1234", "a truncated fixed64"},
      {"truncated fixed32", WireTag(50, 5) + "12", "a truncated fixed32"},
      {"length past the end", WireTag(6, 2) + WireVarint(5) + "abc", "a length (5) past the end"},
      {"huge length", WireTag(6, 2) + WireVarint(uint64_t{1} << 62) + "abc",
       "a length (4611686018427387904) past the end"},
      {"truncated length", WireTag(6, 2) + "\x80", "a truncated length"},
      {"stray end group", WireTag(5, 4), "an end-group tag without its start"},
      {"unterminated group", WireTag(60, 3) + WireInt(1, 1), "group 60 never ends"},
      {"mismatched group end", WireTag(60, 3) + WireTag(61, 4), "an end-group tag without"},
      {"broken inside a message", WireLen(7, WireLen(2, "hi") + WireTag(2, 2) + WireVarint(9)),
       "a length (9) past the end at byte 6 of 8 (inside messages[0])"},
  };
  for (const auto& c : cases) {
    const absl::Status s = CheckWireUtf8(d, c.wire);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.name << ": " << s;
    EXPECT_NE(s.message().find("glmserve.v1.GenerateRequest"), std::string::npos) << c.name;
    v1::GenerateRequest parsed;
    EXPECT_EQ(ParseCheckedMessage(c.wire, &parsed).code(), absl::StatusCode::kInvalidArgument);
  }
  // Passes the walk (a packed field's contents are not text), but not protobuf's parse.
  v1::GenerateRequest parsed;
  const absl::Status s = ParseCheckedMessage(WireLen(1, std::string("\xff", 1)), &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "the request is not a valid glmserve.v1.GenerateRequest (malformed protobuf wire "
            "data)");
}

TEST(WireUtf8Test, NestingIsBounded) {
  const Descriptor& d = *v1::GenerateRequest::descriptor();
  // Unknown groups nest: up to kMaxWireDepth is the wire format (protobuf's own limit), one
  // more is refused, and a hostile depth is refused without exhausting the stack.
  const auto groups = [](int depth) {
    std::string wire;
    for (int i = 0; i < depth; ++i) wire += WireTag(90, 3);
    for (int i = 0; i < depth; ++i) wire += WireTag(90, 4);
    return wire;
  };
  EXPECT_TRUE(CheckWireUtf8(d, groups(kMaxWireDepth)).ok());
  for (int depth : {kMaxWireDepth + 1, 1000000}) {
    const absl::Status s = CheckWireUtf8(d, groups(depth));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << depth;
    EXPECT_NE(s.message().find("nested deeper than 100"), std::string::npos) << s;
  }
  // A length-delimited unknown field is never entered, however deep its contents look.
  std::string nested = "x";
  for (int i = 0; i < 200; ++i) nested = WireLen(99, nested);
  EXPECT_TRUE(CheckWireUtf8(d, nested).ok());
}

TEST(WireUtf8Test, HugeFieldsAreWalkedInLinearTime) {
  // 64 MiB of text (the server's default message limit) in one field and 10^5 stop strings.
  const std::string big(64 << 20, 'a');
  EXPECT_TRUE(CheckWireUtf8(*v1::TokenizeRequest::descriptor(), WireLen(1, big)).ok());
  std::string stops;
  for (int i = 0; i < 100000; ++i) stops += WireLen(4, "stop");
  stops += WireLen(4, kBadUtf8);
  const absl::Status s = CheckWireUtf8(*v1::GenerateRequest::descriptor(), WireLen(3, stops));
  EXPECT_TRUE(absl::StartsWith(s.message(), "stop.stop_strings[100000] is not valid UTF-8")) << s;
}

TEST(WireUtf8Test, JsonMappingIsTextAgain) {
  // proto3's JSON form (grpcurl, gRPC-JSON transcoding) reads and writes the request text as
  // text, as before the fields were briefly `bytes` (which JSON carries as base64).
  v1::GenerateRequest request;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"messages":[{"role":"user","content":"Hi"}],"prompt_text":"x \u00e9",)"
                  R"("stop":{"stop_strings":["END"]},"tools_json":["{}"],"tool_choice":"auto"})",
                  &request)
                  .ok());
  ASSERT_EQ(request.messages_size(), 1);
  EXPECT_EQ(request.messages(0).role(), "user");
  EXPECT_EQ(request.messages(0).content(), "Hi");
  EXPECT_EQ(request.prompt_text(), "x \xC3\xA9");
  EXPECT_EQ(request.stop().stop_strings(0), "END");
  EXPECT_EQ(request.tool_choice(), "auto");
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(request, &json).ok());
  EXPECT_NE(json.find(R"("content":"Hi")"), std::string::npos) << json;
  v1::TokenizeRequest tokenize;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(R"({"text":"Hello world"})", &tokenize).ok());
  EXPECT_EQ(tokenize.text(), "Hello world");
}

}  // namespace
}  // namespace glmserve
