# Runs dhisparse-plan on the shipped example layout (examples/layouts/deepseek_v32.json) and checks
# the printed configuration against numbers stated here, then on a broken layout. Invoked by CTest:
#   cmake -DTOOL=<dhisparse-plan> -DSOURCE_DIR=<repo> -DHAVE_JSON=<0|1> -P check_plan_output.cmake
cmake_minimum_required(VERSION 3.25)

set(example "${SOURCE_DIR}/examples/layouts/deepseek_v32.json")
set(broken "${SOURCE_DIR}/tools/tests/bad_row_bytes.json")

if(NOT HAVE_JSON)
  # Built without nlohmann_json: the option is refused with a message that says why.
  execute_process(COMMAND "${TOOL}" --layout-file "${example}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "without nlohmann_json")
    message(FATAL_ERROR "expected exit 2 and a message naming nlohmann_json, got ${rc}: ${err}")
  endif()
  return()
endif()

# The issue's 61-layer model: 4 slots of up to 41,800 tokens holding 91,200 tokens together, an
# 8 GiB GPU budget, B = 2048.
execute_process(
  COMMAND "${TOOL}" --layout-file "${example}" --slots 4 --context 41800 --live-context 91200 --pool-gib 8
          --hot 2048 --json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dhisparse-plan failed (${rc}): ${err}")
endif()

function(expect value)
  string(JSON actual GET "${out}" ${ARGN})
  if(NOT actual STREQUAL "${value}")
    message(SEND_ERROR "${ARGN}: expected ${value}, printed ${actual}")
  else()
    message(STATUS "${ARGN} = ${actual}")
  endif()
endfunction()

expect("deepseek-v3.2-like" layout)
expect(61 model sources)
expect(40016 model payload_bytes_per_row)        # 61 sources x 656 B
expect(8052 model index_key_bytes_per_row)       # 61 x 132 B
expect(4 config hierarchy_config max_requests)
expect(41800 config hierarchy_config max_rows)   # m = 1
expect(64 config hierarchy_config tail_rows)     # one page
expect(1 config hierarchy_config max_block)      # no drafter
# Host pages: the default pins 4 x ceil(41,800 / 64) = 2,616 pages per source (6.70 GB); the live
# context needs floor((91,200 + 4 x 63) / 64) = 1,428 (3.66 GB).
expect(2616 config derived default_host_pages)
expect(1428 config hierarchy_config host_pages)
expect(3657142272 config host_hierarchy host_store_bytes)  # 1,428 x 64 x 40,016
expect(3657142272 config cuda_hierarchy pinned_bytes)
# Optional pool: every complete page of the live histories, floor(91,200 / 64) = 1,425, fits in 8 GiB.
expect(1425 config hierarchy_config optional_pages)
expect(0 config residency_config required_pages)
expect(0 config residency_config reserve_pages)
# Simulated pools: (4 x (2,048 + 64) + 1,425 x 64) rows x 40,016 B.
expect(3987514368 config host_hierarchy pool_bytes)
expect(0 config host_hierarchy staging_arena_bytes)

# A broken layout: exit status 2 and a message naming the source at fault.
execute_process(COMMAND "${TOOL}" --layout-file "${broken}" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "source 2: row_bytes")
  message(SEND_ERROR "broken layout: expected exit 2 and 'source 2: row_bytes', got ${rc}: ${err}")
endif()
