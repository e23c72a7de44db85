# cmake -DCOMPILER=<c++> -DINCLUDE_DIR=<dir> -DWORK_DIR=<dir> -P DhisparseHeaderCheck.cmake
#
# Every public host header (include/dhisparse/**/*.hpp outside detail/) compiles on its own: a
# translation unit that includes only that header must pass `-std=c++20 -fsyntax-only`. A header
# that leans on what another header happened to include first breaks an engine that includes it
# alone; this finds it before they do.
foreach(var COMPILER INCLUDE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "DhisparseHeaderCheck.cmake: ${var} is not set")
  endif()
endforeach()

file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/dhisparse/*.hpp")
list(FILTER headers EXCLUDE REGEX "/detail/")
list(SORT headers)
if(NOT headers)
  message(FATAL_ERROR "no public headers under ${INCLUDE_DIR}/dhisparse")
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")
set(failed "")
foreach(header IN LISTS headers)
  string(MAKE_C_IDENTIFIER "${header}" stem)
  set(tu "${WORK_DIR}/${stem}.cpp")
  file(WRITE "${tu}" "#include <${header}>\n")
  execute_process(
    COMMAND "${COMPILER}" -std=c++20 -fsyntax-only "-I${INCLUDE_DIR}" "${tu}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(APPEND failed "\n--- ${header} does not compile on its own:\n${out}")
  endif()
endforeach()
list(LENGTH headers count)
if(failed)
  message(FATAL_ERROR "public headers that are not self-contained:${failed}")
endif()
message(STATUS "${count} public headers compile on their own")
