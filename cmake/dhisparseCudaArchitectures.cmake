# The CUDA architectures of dhisparse::cuda's consumers (included by dhisparse's CMakeLists.txt and
# by the installed dhisparseConfig.cmake).
#
# The CUDA backend needs compute capability DHISPARSE_CUDA_MINIMUM_ARCHITECTURE (8.0: warp
# reductions, cp.async; include/dhisparse/detail/config.hpp says so for the headers, whose device
# code stops with an #error below it). A project that enables CUDA without choosing architectures
# gets CMake's default, which is nvcc's (sm_75 for nvcc 12 and 13): too old. Such a project's
# default is raised to DHISPARSE_CUDA_DEFAULT_ARCHITECTURES; an explicit choice is never changed.
include_guard(DIRECTORY)

# 80-real: SASS for 8.x GPUs. 90: SASS for 9.0 and PTX for newer GPUs, so that the programmatic
# launch prologue (sm_90 and newer only) is present wherever programmatic launch can be enabled.
set(DHISPARSE_CUDA_DEFAULT_ARCHITECTURES "80-real;90")

# dhisparse_cuda_architectures_below(<out-var> <minimum> <architectures>)
# <out-var>: the entries of <architectures> (a CMAKE_CUDA_ARCHITECTURES value) that compile device
# code older than <minimum>; "all" and "all-major" include such, and so does OFF (no flag: nvcc's
# default architecture). "native" is resolved through CMAKE_CUDA_ARCHITECTURES_NATIVE when known.
function(dhisparse_cuda_architectures_below out minimum architectures)
  set(below "")
  if(NOT architectures)  # OFF / FALSE: CMake passes no -arch, nvcc compiles for its default
    list(APPEND below "${architectures} (nvcc's default architecture)")
  endif()
  foreach(arch IN LISTS architectures)
    if(arch STREQUAL "native" AND CMAKE_CUDA_ARCHITECTURES_NATIVE)
      dhisparse_cuda_architectures_below(native_below ${minimum} "${CMAKE_CUDA_ARCHITECTURES_NATIVE}")
      list(APPEND below ${native_below})
    elseif(arch STREQUAL "all" OR arch STREQUAL "all-major")
      list(APPEND below "${arch}")
    elseif(arch MATCHES "^([0-9]+)" AND CMAKE_MATCH_1 LESS minimum)
      list(APPEND below "${arch}")
    endif()
  endforeach()
  set(${out} "${below}" PARENT_SCOPE)
endfunction()

# dhisparse_cuda_architectures_left_default(<out-var>): TRUE when CMAKE_CUDA_ARCHITECTURES is the
# value CMake chose itself when CUDA was enabled (nothing set by the project, the command line or
# CUDAARCHS). CMake stores its default in the cache with the help string "CUDA architectures";
# a -D on the command line has another help string, and a project's set() shadows the cache.
function(dhisparse_cuda_architectures_left_default out)
  set(result FALSE)
  if(DEFINED CACHE{CMAKE_CUDA_ARCHITECTURES} AND "$ENV{CUDAARCHS}" STREQUAL "")
    get_property(help CACHE CMAKE_CUDA_ARCHITECTURES PROPERTY HELPSTRING)
    if(help STREQUAL "CUDA architectures" AND "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
      set(result TRUE)
    endif()
  endif()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# dhisparse_cuda_architectures_for_consumer(): in the calling scope, raises CMAKE_CUDA_ARCHITECTURES
# to DHISPARSE_CUDA_DEFAULT_ARCHITECTURES when the project left CMake's default in place and that
# default is below the minimum (sets DHISPARSE_CUDA_ARCHITECTURES_RAISED), and warns when the
# project chose architectures below the minimum itself. A macro: it sets the caller's variables.
macro(dhisparse_cuda_architectures_for_consumer)
  set(DHISPARSE_CUDA_ARCHITECTURES_RAISED FALSE)
  dhisparse_cuda_architectures_below(_dhisparse_below ${DHISPARSE_CUDA_MINIMUM_ARCHITECTURE}
                                     "${CMAKE_CUDA_ARCHITECTURES}")
  if(_dhisparse_below)
    dhisparse_cuda_architectures_left_default(_dhisparse_default)
    if(_dhisparse_default)
      message(STATUS "dhisparse: CMAKE_CUDA_ARCHITECTURES was left at CMake's default "
                     "(${CMAKE_CUDA_ARCHITECTURES}), below dhisparse::cuda's minimum "
                     "${DHISPARSE_CUDA_MINIMUM_ARCHITECTURE}; using ${DHISPARSE_CUDA_DEFAULT_ARCHITECTURES} "
                     "for targets created from here on (set CMAKE_CUDA_ARCHITECTURES to choose)")
      set(CMAKE_CUDA_ARCHITECTURES "${DHISPARSE_CUDA_DEFAULT_ARCHITECTURES}")
      set(DHISPARSE_CUDA_ARCHITECTURES_RAISED TRUE)
    else()
      message(WARNING "dhisparse: CMAKE_CUDA_ARCHITECTURES (${CMAKE_CUDA_ARCHITECTURES}) includes "
                      "${_dhisparse_below}, below dhisparse::cuda's minimum compute capability "
                      "${DHISPARSE_CUDA_MINIMUM_ARCHITECTURE}: a target that includes dhisparse's CUDA "
                      "headers will stop with an #error unless its CUDA_ARCHITECTURES are all "
                      "${DHISPARSE_CUDA_MINIMUM_ARCHITECTURE} or newer")
    endif()
  endif()
  unset(_dhisparse_below)
  unset(_dhisparse_default)
endmacro()
