# Fixture of the plugin tests: install this build into a private prefix, then
# configure and build examples/transport against that prefix alone — its
# CMakeLists finds keybus through pkg-config, so PKG_CONFIG_PATH is all it
# gets (no include path into the source tree).
#   cmake -DBUILD=<build dir> -DSOURCE=<examples/transport> -DROOT=<work dir>
#         -DLIBDIR=<lib dir name> [-DC_FLAGS=...] [-DLINK_FLAGS=...] -P plugin_install.cmake
# Leaves ROOT/prefix (the install), ROOT/build/libkb_file.so and ROOT/data/.
foreach(var BUILD SOURCE ROOT LIBDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "plugin_install.cmake: -D${var}=... is missing")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
endfunction()

file(REMOVE_RECURSE ${ROOT})
file(MAKE_DIRECTORY ${ROOT}/data)
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${ROOT}/prefix)
set(ENV{PKG_CONFIG_PATH} ${ROOT}/prefix/${LIBDIR}/pkgconfig)
# Sanitizer builds: the plugin runs inside an instrumented process, so it is
# instrumented the same way.
run("configuring examples/transport" ${CMAKE_COMMAND} -S ${SOURCE} -B ${ROOT}/build
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS=-Werror ${C_FLAGS}"
    "-DCMAKE_MODULE_LINKER_FLAGS=${LINK_FLAGS}")
run("building examples/transport" ${CMAKE_COMMAND} --build ${ROOT}/build)
message(STATUS "plugin: ${ROOT}/build/libkb_file.so, built against ${ROOT}/prefix")
