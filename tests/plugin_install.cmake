# Fixture of the plugin tests: install this build into a private prefix, then
# configure and build examples/transport against that prefix alone — its
# CMakeLists finds keybus's CMake package there (CMAKE_PREFIX_PATH is all it
# gets: no include path into the source tree).
#   cmake -DBUILD=<build dir> -DSOURCE=<examples/transport> -DROOT=<work dir>
#         -DLIBDIR=<lib dir name> [-DC_FLAGS=...] [-DLINK_FLAGS=...] -P plugin_install.cmake
# Leaves ROOT/prefix (the install), ROOT/build/libkb_file.so and ROOT/data/.
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
kb_require(BUILD SOURCE ROOT LIBDIR)

file(REMOVE_RECURSE ${ROOT})
file(MAKE_DIRECTORY ${ROOT}/data)
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${ROOT}/prefix)
# Sanitizer builds: the plugin runs inside an instrumented process, so it is
# instrumented the same way.
run("configuring examples/transport" ${CMAKE_COMMAND} -S ${SOURCE} -B ${ROOT}/build
    -DCMAKE_PREFIX_PATH=${ROOT}/prefix -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS=-Werror ${C_FLAGS}"
    "-DCMAKE_MODULE_LINKER_FLAGS=${LINK_FLAGS}")
run("building examples/transport" ${CMAKE_COMMAND} --build ${ROOT}/build)
message(STATUS "plugin: ${ROOT}/build/libkb_file.so, built against ${ROOT}/prefix")
