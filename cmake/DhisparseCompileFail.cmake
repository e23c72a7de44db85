# cmake -DCOMPILER=<c++> -DSOURCE=<file.cpp> -DINCLUDE_DIR=<dir> -P DhisparseCompileFail.cmake
#
# A compile-fail test: SOURCE must NOT compile, and the compiler's output must contain the text of
# every "// expect: " line of SOURCE (e.g. the rule's message and, on a second line, the
# source_at_fault<3, L> that names the index at fault).
foreach(var COMPILER SOURCE INCLUDE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "DhisparseCompileFail.cmake: ${var} is not set")
  endif()
endforeach()

file(STRINGS "${SOURCE}" expect_lines REGEX "^// expect: ")
if(NOT expect_lines)
  message(FATAL_ERROR "${SOURCE}: no '// expect: ' line")
endif()

execute_process(
  COMMAND "${COMPILER}" -std=c++20 -fsyntax-only "-I${INCLUDE_DIR}" "${SOURCE}"
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()

set(missing "")
foreach(line IN LISTS expect_lines)
  string(REPLACE "// expect: " "" text "${line}")
  string(FIND "${out}" "${text}" at)
  if(at EQUAL -1)
    string(APPEND missing "\n  ${text}")
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "${SOURCE} failed to compile, but the output lacks:${missing}\n"
                      "compiler output:\n${out}")
endif()
message(STATUS "${SOURCE}: does not compile, with every expected message")
