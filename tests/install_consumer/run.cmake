# ctest driver: installs the built tree into a fresh prefix, then configures, builds and runs the
# consumer project against that prefix alone, and builds and runs it once more from the compiler
# flags of the installed tileattn.pc (where pkg-config is installed).
# Inputs: BUILD_DIR, SOURCE_DIR (this folder), WORK_DIR, GENERATOR, CXX.
file(REMOVE_RECURSE "${WORK_DIR}")

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(JOIN " " cmd ${ARGN})
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
message("${last_output}")

find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  file(GLOB_RECURSE pc_file "${WORK_DIR}/prefix/*/tileattn.pc")
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  step(${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${pc_dir}:$ENV{PKG_CONFIG_PATH}" ${PKG_CONFIG} --cflags --libs tileattn)
  separate_arguments(pc_flags UNIX_COMMAND "${last_output}")
  step(${CXX} -std=c++20 -O2 "${SOURCE_DIR}/consumer.cpp" ${pc_flags} -o "${WORK_DIR}/consumer_pc")
  step("${WORK_DIR}/consumer_pc")
  message("pkg-config: ${last_output}")
endif()
