# Installation rules of the server build (included by the top-level CMakeLists.txt).
# Installation: the binaries, and the client library as a CMake package
# (find_package(glmserve) gives glmserve::client) and a pkg-config file (glmserve-client).
# Headers go under include/glmserve and are included as "client/client.h".
include(CMakePackageConfigHelpers)
install(TARGETS glm-server glm-client RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set_target_properties(glm_client PROPERTIES EXPORT_NAME client)
set_target_properties(glm_wire PROPERTIES EXPORT_NAME wire)
set_target_properties(glm_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(glm_dtype PROPERTIES EXPORT_NAME dtype)
install(TARGETS glm_client glm_wire glm_proto glm_dtype EXPORT glmserveTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT glmserveTargets NAMESPACE glmserve::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/glmserve)
configure_package_config_file(cmake/glmserveConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/glmserveConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/glmserve)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/glmserveConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/glmserveConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/glmserveConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/glmserve)
file(RELATIVE_PATH GLM_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file(cmake/glmserve-client.pc.in ${CMAKE_CURRENT_BINARY_DIR}/glmserve-client.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/glmserve-client.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES client/client.h client/bench.h client/scrape.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/glmserve/client)
install(FILES proto/tensor_codec.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/glmserve/proto)
install(FILES core/base/dtype.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/glmserve/core/base)
# The .proto files, for clients in other languages (docs/api.md).
install(DIRECTORY proto/ DESTINATION ${CMAKE_INSTALL_DATADIR}/glmserve/proto
        FILES_MATCHING PATTERN "*.proto")
