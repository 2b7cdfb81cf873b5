# The engine's layers (core/<layer>/), written once: which folder may include which. The same
# table gives each layer's CMake library its link dependencies (core/CMakeLists.txt) and drives
# the include check below, which runs when the project is configured and again whenever a core
# source changes (a build step of every core library), so an include against the layering
# fails the configure or the build. docs/architecture.md draws the same graph.
#
#   base     status macros, file I/O, the thread pool, dtypes, the .npy format
#   request  the generation request and its ending, as front ends and the engine see them
#   model    config, checkpoint formats, weights, KV cache, forward types, the runner interface
#   cpu      the CPU model and its kernels (ops/), quantization, alignment
#   cuda     the CUDA backend (kernels and runner)
#   text     tokenizer, chat format, detokenizer, output parsing (no engine)
#   engine   API, scheduler, step runner, sessions, prefix cache, sampling, the runner factory
#
# Script mode (tests/cmake/core_layers_test.sh): cmake -DGLM_LAYERS_ROOT=<source root> -P
# cmake/core_layers.cmake exits non-zero listing every violation.

cmake_policy(SET CMP0057 NEW)  # if(IN_LIST), in script mode too

set(GLM_CORE_LAYERS base request model cpu cuda text engine)
set(GLM_CORE_LAYER_DEPS_base "")
set(GLM_CORE_LAYER_DEPS_request base)
set(GLM_CORE_LAYER_DEPS_model base)
set(GLM_CORE_LAYER_DEPS_cpu model base)
set(GLM_CORE_LAYER_DEPS_cuda model base)
set(GLM_CORE_LAYER_DEPS_text request base)
set(GLM_CORE_LAYER_DEPS_engine request model cpu cuda base)

# Sets `out_var` to the list of violations under `root`/core: a file at core/'s top (every
# file belongs to a layer's folder), a layer including a folder its row does not list, or any
# core file including something outside core/ of this project (server/, proto/, client/,
# tools/, bench/, tests/): the engine is transport-free.
function(glm_check_core_layers root out_var)
  set(errors "")
  file(GLOB top_files LIST_DIRECTORIES false ${root}/core/*)
  foreach(f ${top_files})
    get_filename_component(name ${f} NAME)
    if(NOT name STREQUAL "CMakeLists.txt")
      list(APPEND errors "core/${name}: every core file lives in a layer's folder")
    endif()
  endforeach()
  file(GLOB dirs LIST_DIRECTORIES true ${root}/core/*)
  foreach(d ${dirs})
    if(IS_DIRECTORY ${d})
      get_filename_component(layer ${d} NAME)
      if(NOT layer IN_LIST GLM_CORE_LAYERS)
        list(APPEND errors "core/${layer}/: not a layer of cmake/core_layers.cmake")
      endif()
    endif()
  endforeach()
  foreach(layer ${GLM_CORE_LAYERS})
    set(allowed ${layer} ${GLM_CORE_LAYER_DEPS_${layer}})
    string(REPLACE ";" ", " allowed_text "${allowed}")
    file(GLOB_RECURSE sources ${root}/core/${layer}/*.h ${root}/core/${layer}/*.cc
         ${root}/core/${layer}/*.cu ${root}/core/${layer}/*.cuh)
    foreach(src ${sources})
      file(RELATIVE_PATH rel ${root} ${src})
      file(STRINGS ${src} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
      foreach(line ${includes})
        string(REGEX REPLACE "^[^\"]*\"([^\"]*)\".*$" "\\1" path "${line}")
        if(path MATCHES "^core/([^/]+)/")
          set(target ${CMAKE_MATCH_1})
          if(NOT target IN_LIST allowed)
            list(APPEND errors "${rel} includes ${path}: core/${layer} may include only core/{${allowed_text}} (cmake/core_layers.cmake)")
          endif()
        elseif(path MATCHES "^core/")
          list(APPEND errors "${rel} includes ${path}: not in a layer's folder")
        elseif(path MATCHES "^(server|proto|client|tools|bench|tests)/")
          list(APPEND errors "${rel} includes ${path}: core/ is below every front end")
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(${out_var} "${errors}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT GLM_LAYERS_ROOT)
    message(FATAL_ERROR "usage: cmake -DGLM_LAYERS_ROOT=<source root> -P core_layers.cmake")
  endif()
  glm_check_core_layers(${GLM_LAYERS_ROOT} errors)
  if(errors)
    string(REPLACE ";" "\n  " text "${errors}")
    message(FATAL_ERROR "core/ layering violated:\n  ${text}")
  endif()
  if(GLM_LAYERS_STAMP)
    file(TOUCH ${GLM_LAYERS_STAMP})
  endif()
endif()
