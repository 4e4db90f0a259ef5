# Helpers every CMakeLists below uses, so that all targets get the same flags and precompiled header.

# ulysses_library(NAME [NO_PCH] SOURCES a.cpp b.cpp DEPS other_lib ...)
#   A static library of one area of src/ or tuner/, includable as "area/file.h" from src/.
#   NO_PCH: its sources include no LibTorch header, so they skip the (1 GB) precompiled LibTorch
#   header and compile in seconds (most of tuner/).
function(ulysses_library name)
  cmake_parse_arguments(ARG "NO_PCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} ${TORCH_LIBRARIES} Threads::Threads)
  if(ARG_NO_PCH)
    set_target_properties(${name} PROPERTIES ULYSSES_NO_PCH ON)
  endif()
  ulysses_common_flags(${name})
endfunction()

# ulysses_test(NAME [NO_PCH] SOURCES a_test.cpp ... DEPS lib ... [LABELS l] [TIMEOUT s] [COST c])
#   One GoogleTest executable, registered with ctest as one test per test suite (TEST, TEST_F and
#   TEST_P's first argument, read from SOURCES; the parameterized ones under any instantiation
#   prefix): a suite's cases share one process start (LibTorch's load costs about a third of a
#   second, more than most cases take), and gtest's output still names each case that failed.
#   TIMEOUT and COST are per case (seconds); a suite gets them times its number of cases (the
#   timeout at most 1200 s), so ctest -j starts the costly suites first.
function(ulysses_test name)
  cmake_parse_arguments(ARG "NO_PCH" "TIMEOUT;COST" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  if(ARG_NO_PCH)
    set_target_properties(${name} PROPERTIES ULYSSES_NO_PCH ON)
  endif()
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} ulysses_test_support GTest::gtest GTest::gtest_main)
  ulysses_common_flags(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 1)
  endif()
  # The suites and their case counts, in the order the sources first name them.
  set(suites "")
  foreach(source ${ARG_SOURCES})
    get_filename_component(path ${source} ABSOLUTE)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})  # a new suite re-registers
    file(STRINGS ${path} lines REGEX "^[ \t]*TEST(_F|_P)?[ \t]*\\([ \t]*[A-Za-z0-9_]+[ \t]*,")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*TEST(_F|_P)?[ \t]*\\([ \t]*([A-Za-z0-9_]+).*" "\\2" suite "${line}")
      if(NOT suite IN_LIST suites)
        list(APPEND suites ${suite})
        set(cases_${suite} 0)
      endif()
      math(EXPR cases_${suite} "${cases_${suite}} + 1")
    endforeach()
  endforeach()
  if(NOT suites)
    message(FATAL_ERROR "ulysses_test(${name}): no TEST, TEST_F or TEST_P in ${ARG_SOURCES}")
  endif()
  foreach(suite ${suites})
    # Two directories may each register a test of one name, and ctest -R cannot tell them apart;
    # `if(TEST)` sees only this directory's tests, so the suites are kept in a global list too.
    get_property(registered GLOBAL PROPERTY ULYSSES_TEST_SUITES)
    if(suite IN_LIST registered OR TEST ${suite})
      message(FATAL_ERROR "ulysses_test(${name}): test suite ${suite} is also in another executable")
    endif()
    set_property(GLOBAL APPEND PROPERTY ULYSSES_TEST_SUITES ${suite})
    math(EXPR timeout "${ARG_TIMEOUT} * ${cases_${suite}}")
    if(timeout GREATER 1200)
      set(timeout 1200)
    endif()
    if(timeout LESS ARG_TIMEOUT)
      set(timeout ${ARG_TIMEOUT})
    endif()
    math(EXPR cost "${ARG_COST} * ${cases_${suite}}")
    add_test(NAME ${suite} COMMAND $<TARGET_FILE:${name}> "--gtest_filter=${suite}.*:*/${suite}.*")
    # Tests find binaries beside themselves (build/bin) and the project root through
    # common/paths.h, so the only environment they need is one OpenMP thread per rank.
    # ULYSSES_PYTHON: the venv Python whose real clients check what we write (tests/clients/).
    # A filter that selects no case (a suite renamed behind a macro) fails rather than passes.
    set_tests_properties(${suite} PROPERTIES TIMEOUT ${timeout} COST ${cost}
      ENVIRONMENT "OMP_NUM_THREADS=1;ULYSSES_PYTHON=${ULYSSES_PYTHON}"
      FAIL_REGULAR_EXPRESSION "Running 0 tests from"
      LABELS "${ARG_LABELS}")
  endforeach()
endfunction()

# ulysses_isa_variants(TARGET FILTER gtest-filter [TIMEOUT s] [COST c] [LABELS l])
#   The cases of one GoogleTest executable that FILTER selects, run again (one ctest test per
#   instruction set, TARGET.isa_<isa>) with the host AdamW pass capped to each instruction set this
#   machine has below its best (ULYSSES_CPU_ISA) and ATen's CPU kernels capped alike
#   (ATEN_CPU_CAPABILITY): a result that holds on one instruction set only then fails on any
#   machine, not on the one CI happens to get. The uncapped run is the executable's own tests.
function(ulysses_isa_variants target)
  cmake_parse_arguments(ARG "" "FILTER;TIMEOUT;COST" "LABELS" ${ARGN})
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    return()
  endif()
  set(cpuinfo "")
  if(EXISTS /proc/cpuinfo)
    file(READ /proc/cpuinfo cpuinfo)
  endif()
  # Caps below the best this CPU has: baseline always; avx2 where AVX-512 is the best.
  set(caps "baseline:default")
  if(cpuinfo MATCHES "avx512f" AND cpuinfo MATCHES "avx512vl" AND cpuinfo MATCHES "avx512bw"
     AND cpuinfo MATCHES "avx512dq")
    list(APPEND caps "avx2:avx2")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  foreach(cap ${caps})
    string(REPLACE ":" ";" pair ${cap})
    list(GET pair 0 ours)
    list(GET pair 1 aten)
    add_test(NAME ${target}.isa_${ours}
             COMMAND $<TARGET_FILE:${target}> --gtest_filter=${ARG_FILTER})
    set_tests_properties(${target}.isa_${ours} PROPERTIES TIMEOUT ${ARG_TIMEOUT}
      ENVIRONMENT "OMP_NUM_THREADS=1;ULYSSES_CPU_ISA=${ours};ATEN_CPU_CAPABILITY=${aten};ULYSSES_PYTHON=${ULYSSES_PYTHON}"
      LABELS "isa;${ARG_LABELS}")
    if(ARG_COST)
      set_tests_properties(${target}.isa_${ours} PROPERTIES COST ${ARG_COST})
    endif()
  endforeach()
endfunction()

function(ulysses_common_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_compile_definitions(${target} PRIVATE ULYSSES_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(ULYSSES_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC ULYSSES_WITH_CUDA=1)
  endif()
  get_target_property(no_pch ${target} ULYSSES_NO_PCH)
  if(ULYSSES_USE_PCH AND NOT no_pch AND NOT target STREQUAL "ulysses_pch")
    # One precompiled LibTorch header for the whole tree (building one costs about a minute).
    target_precompile_headers(${target} REUSE_FROM ulysses_pch)
  endif()
endfunction()

# The shared precompiled header: an object library every target reuses (same flags for all).
function(ulysses_pch_target)
  add_library(ulysses_pch OBJECT ${PROJECT_SOURCE_DIR}/src/common/pch.cpp)
  target_include_directories(ulysses_pch PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  target_link_libraries(ulysses_pch PUBLIC ${TORCH_LIBRARIES})
  ulysses_common_flags(ulysses_pch)
  if(ULYSSES_USE_PCH)
    target_precompile_headers(ulysses_pch PRIVATE ${PROJECT_SOURCE_DIR}/src/common/pch.h)
  endif()
endfunction()
