# Helpers for dhisparse's own programs (tests, examples, benchmarks).
# Nothing here reaches the installed package or a consumer's targets.
include_guard(GLOBAL)

set(DHISPARSE_TEST_TIMEOUT 900 CACHE STRING "Timeout of each registered test, in seconds")

# Warnings (and optionally -Werror) for our own programs only: never on dhisparse::dhisparse,
# so consumers keep their own warning policy.
add_library(dhisparse_dev_flags INTERFACE)
target_compile_options(dhisparse_dev_flags INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra;-lineinfo>")
if(DHISPARSE_WARNINGS_AS_ERRORS)
  target_compile_options(dhisparse_dev_flags INTERFACE
    "$<$<COMPILE_LANGUAGE:CXX>:-Werror>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Werror>")
endif()

# Compile times: a launcher records each translation unit's CPU and wall time in
# <build>/compile-times.tsv; scripts/check-compile-times holds CUDA TUs to a budget (.ci/run).
option(DHISPARSE_COMPILE_TIMES "Record the compile time of each translation unit of dhisparse's programs" ON)
set(DHISPARSE_COMPILE_TIMES_LOG "${PROJECT_BINARY_DIR}/compile-times.tsv")

# Sanitizers (DHISPARSE_SANITIZE, e.g. "address,undefined") apply to host programs only;
# CUDA programs and AddressSanitizer do not mix well.
add_library(dhisparse_host_sanitize INTERFACE)
if(DHISPARSE_SANITIZE)
  target_compile_options(dhisparse_host_sanitize INTERFACE
    "-fsanitize=${DHISPARSE_SANITIZE}" -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(dhisparse_host_sanitize INTERFACE "-fsanitize=${DHISPARSE_SANITIZE}")
endif()

# _dhisparse_is_cuda(<out-var> <source>...): TRUE if any source is a .cu file.
function(_dhisparse_is_cuda out)
  set(result FALSE)
  foreach(src IN LISTS ARGN)
    if(src MATCHES "\\.cu$")
      set(result TRUE)
    endif()
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# dhisparse_add_program(<name> SOURCES <src>... [LIBRARIES <target>...])
#
# An executable of ours. Sources ending in .cu make it a CUDA program linked to
# dhisparse::cuda (only call this for .cu sources when DHISPARSE_CUDA_ENABLED); otherwise it is a
# host program linked to dhisparse::dhisparse (plus the host sanitizers, if any).
function(dhisparse_add_program name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBRARIES")
  add_executable(${name} ${arg_SOURCES})
  _dhisparse_is_cuda(is_cuda ${arg_SOURCES})
  if(is_cuda)
    if(NOT TARGET dhisparse::cuda)
      message(FATAL_ERROR "${name}: CUDA sources but the CUDA backend is not enabled")
    endif()
    target_link_libraries(${name} PRIVATE dhisparse::cuda)
    # One CUDA runtime per program: the shared one that CUDA::cudart names.
    set_target_properties(${name} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  else()
    target_link_libraries(${name} PRIVATE dhisparse::dhisparse dhisparse_host_sanitize)
  endif()
  target_link_libraries(${name} PRIVATE dhisparse_dev_flags ${arg_LIBRARIES})
  if(DHISPARSE_COMPILE_TIMES)
    # Ahead of any launcher the project already uses (e.g. ccache), which then runs under it.
    foreach(lang IN ITEMS CXX CUDA)
      set(launcher "${PROJECT_SOURCE_DIR}/cmake/dhisparse-compile-timer.sh" "${DHISPARSE_COMPILE_TIMES_LOG}"
                   ${CMAKE_${lang}_COMPILER_LAUNCHER})
      set_target_properties(${name} PROPERTIES ${lang}_COMPILER_LAUNCHER "${launcher}")
    endforeach()
  endif()
endfunction()

# dhisparse_add_test(<name> SOURCES <src>... [LIBRARIES <target>...] [LABELS <label>...])
#
# A test program registered with CTest (working directory: the top build directory, timeout
# DHISPARSE_TEST_TIMEOUT). Host tests get the label `host`, CUDA tests the label `gpu`.
# With DHISPARSE_CUDA_COMPILE_ONLY, CUDA tests are built (compiled and linked) but not registered.
function(dhisparse_add_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBRARIES;LABELS")
  dhisparse_add_program(${name} SOURCES ${arg_SOURCES} LIBRARIES ${arg_LIBRARIES})
  _dhisparse_is_cuda(is_cuda ${arg_SOURCES})
  if(is_cuda)
    if(DHISPARSE_CUDA_COMPILE_ONLY)
      return()
    endif()
    set(labels gpu ${arg_LABELS})
  else()
    set(labels host ${arg_LABELS})
  endif()
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY "${PROJECT_BINARY_DIR}")
  set_tests_properties(${name} PROPERTIES
    LABELS "${labels}"
    TIMEOUT ${DHISPARSE_TEST_TIMEOUT})
endfunction()
