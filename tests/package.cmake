# Applications outside the tree build against the install the plugin fixture
# made (tests/plugin_install.cmake): examples/hello.c through
# find_package(keybus 0.1 CONFIG REQUIRED) and keybus::keybus, then run; and
# examples/transport through pkg-config (keybus.pc).
#   cmake -DSOURCE=<source dir> -DROOT=<fixture dir> -DLIBDIR=<lib dir name>
#         [-DC_FLAGS=...] [-DLINK_FLAGS=...] -P package.cmake
include(${CMAKE_CURRENT_LIST_DIR}/run.cmake)
kb_require(SOURCE ROOT LIBDIR)

set(work ${ROOT}/package)
file(REMOVE_RECURSE ${work})
run("configuring the find_package consumer" ${CMAKE_COMMAND} -S ${SOURCE}/tests/package
    -B ${work}/hello -DCMAKE_PREFIX_PATH=${ROOT}/prefix -DHELLO_SOURCE=${SOURCE}/examples/hello.c
    "-DCMAKE_C_FLAGS=-Wall -Werror ${C_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
run("building the find_package consumer" ${CMAKE_COMMAND} --build ${work}/hello)
run("running the find_package consumer" ${work}/hello/hello)
if(NOT run_output MATCHES "handled 3 events of order-123 in order")
  message(FATAL_ERROR "examples/hello.c built with find_package printed:\n${run_output}")
endif()

set(ENV{PKG_CONFIG_PATH} ${ROOT}/prefix/${LIBDIR}/pkgconfig)
run("configuring examples/transport with pkg-config" ${CMAKE_COMMAND}
    -S ${SOURCE}/examples/transport -B ${work}/pkgconfig -DKB_FILE_PKGCONFIG=ON
    "-DCMAKE_C_FLAGS=-Werror ${C_FLAGS}" "-DCMAKE_MODULE_LINKER_FLAGS=${LINK_FLAGS}")
run("building examples/transport with pkg-config" ${CMAKE_COMMAND} --build ${work}/pkgconfig)
message(STATUS "find_package and pkg-config consumers built against ${ROOT}/prefix")
