#include "server/http/json_body.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace glmserve {
namespace {

using Json = nlohmann::json;

// Builds the document from the parser's events, refusing (returning false, which stops the
// parser at once) what json_body.h lists.
class StrictBuilder {
 public:
  bool null() { return Add(Json(nullptr)); }
  bool boolean(bool v) { return Add(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Add(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Add(Json(v)); }
  bool number_float(Json::number_float_t v, const std::string&) { return Add(Json(v)); }
  bool string(std::string& v) { return Add(Json(std::move(v))); }
  bool binary(Json::binary_t&) { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t) { return Open(Json::object()); }
  bool key(std::string& k) {
    if (stack_.back()->contains(k)) {
      return Fail(absl::StrCat("duplicate key '", k.substr(0, 64), "' in an object"));
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return Open(Json::array()); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return Fail(e.what());
  }

  Json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  bool Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

  // Places `v` in the open container (or as the root); the new value's address.
  Json* Place(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  bool Add(Json v) {
    if (++values_ > kMaxJsonValues) {
      return Fail(absl::StrCat("more than ", kMaxJsonValues, " values"));
    }
    Place(std::move(v));
    return true;
  }

  bool Open(Json container) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Fail(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
    }
    if (++values_ > kMaxJsonValues) {
      return Fail(absl::StrCat("more than ", kMaxJsonValues, " values"));
    }
    // A container's address stays valid while it is open: its parent (an array or an
    // object) gets no other element until it closes.
    stack_.push_back(Place(std::move(container)));
    return true;
  }

  Json root_;
  std::vector<Json*> stack_;
  std::string key_;
  size_t values_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonBody(std::string_view body) {
  StrictBuilder builder;
  const bool ok = Json::sax_parse(body.begin(), body.end(), &builder, Json::input_format_t::json,
                                  /*strict=*/true);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: ", builder.error().empty() ? "parse error" : builder.error()));
  }
  return std::move(builder.root());
}

}  // namespace glmserve
