#include "server/reflection.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace glmserve {
namespace {

namespace rv1 = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

void SetError(grpc::StatusCode code, const std::string& message,
              rv1::ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(message);
}

// `file` and every file it imports (transitively), each once, the file itself first: what
// reflection clients need to build the descriptors without asking again.
void AddFileWithDependencies(const FileDescriptor* file, std::set<const FileDescriptor*>* seen,
                             rv1::FileDescriptorResponse* out) {
  if (!seen->insert(file).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileWithDependencies(file->dependency(i), seen, out);
  }
}

}  // namespace

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

rv1::ServerReflectionResponse ReflectionV1Service::Answer(
    const rv1::ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  rv1::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  const auto send_file = [&](const FileDescriptor* file, const std::string& what) {
    if (file == nullptr) return SetError(grpc::StatusCode::NOT_FOUND, what, &response);
    std::set<const FileDescriptor*> seen;
    AddFileWithDependencies(file, &seen, response.mutable_file_descriptor_response());
  };
  switch (request.message_request_case()) {
    case rv1::ServerReflectionRequest::kFileByFilename:
      send_file(pool->FindFileByName(request.file_by_filename()),
                absl::StrCat("file '", request.file_by_filename(), "' not found"));
      break;
    case rv1::ServerReflectionRequest::kFileContainingSymbol:
      send_file(pool->FindFileContainingSymbol(request.file_containing_symbol()),
                absl::StrCat("symbol '", request.file_containing_symbol(), "' not found"));
      break;
    case rv1::ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const google::protobuf::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const google::protobuf::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      send_file(field == nullptr ? nullptr : field->file(),
                absl::StrCat("extension ", ext.extension_number(), " of '", ext.containing_type(),
                             "' not found"));
      break;
    }
    case rv1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("type '", request.all_extension_numbers_of_type(), "' not found"),
                 &response);
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* e : extensions) numbers->add_extension_number(e->number());
      break;
    }
    case rv1::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        if (pool->FindServiceByName(name) != nullptr) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
      }
      break;
    case rv1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(grpc::StatusCode::INVALID_ARGUMENT, "the request names no question", &response);
      break;
  }
  return response;
}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<rv1::ServerReflectionResponse, rv1::ServerReflectionRequest>* stream) {
  rv1::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace glmserve
