# Transports as plugins (issues 14 and 16). The fixture installs this build
# into a private prefix under the build directory and builds
# examples/transport's file:// against that prefix alone; the tests then load
# it with `transport.plugins`, run the transport contract on it, and dlopen the
# installed libkeybus.so.
set(KB_PLUGIN_ROOT ${CMAKE_CURRENT_BINARY_DIR}/plugin)
set(KB_PLUGIN_SO ${KB_PLUGIN_ROOT}/build/libkb_file.so)

# The sanitizer flags of this build, for the plugin loaded into its tests.
get_directory_property(kb_plugin_cflags DIRECTORY ${PROJECT_SOURCE_DIR} COMPILE_OPTIONS)
list(FILTER kb_plugin_cflags INCLUDE REGEX "^-f(no-)?(sanitize|omit-frame-pointer)")
string(JOIN " " kb_plugin_cflags ${kb_plugin_cflags})
get_directory_property(kb_plugin_ldflags DIRECTORY ${PROJECT_SOURCE_DIR} LINK_OPTIONS)
string(JOIN " " kb_plugin_ldflags ${kb_plugin_ldflags})

add_test(NAME plugin_install
  COMMAND ${CMAKE_COMMAND} -DBUILD=${PROJECT_BINARY_DIR}
          -DSOURCE=${PROJECT_SOURCE_DIR}/examples/transport -DROOT=${KB_PLUGIN_ROOT}
          -DLIBDIR=${CMAKE_INSTALL_LIBDIR} "-DC_FLAGS=${kb_plugin_cflags}"
          "-DLINK_FLAGS=${kb_plugin_ldflags}" -P ${CMAKE_CURRENT_SOURCE_DIR}/plugin_install.cmake)
set_tests_properties(plugin_install PROPERTIES FIXTURES_SETUP kb_plugin TIMEOUT 300)

# Applications built against that install: examples/hello.c with
# find_package(keybus CONFIG) and keybus::keybus (run), examples/transport
# with pkg-config.
add_test(NAME package_consumers
  COMMAND ${CMAKE_COMMAND} -DSOURCE=${PROJECT_SOURCE_DIR} -DROOT=${KB_PLUGIN_ROOT}
          -DLIBDIR=${CMAKE_INSTALL_LIBDIR} "-DC_FLAGS=${kb_plugin_cflags}"
          "-DLINK_FLAGS=${kb_plugin_ldflags}" -P ${CMAKE_CURRENT_SOURCE_DIR}/package.cmake)
set_tests_properties(package_consumers PROPERTIES FIXTURES_REQUIRED kb_plugin TIMEOUT 300
                     ENVIRONMENT "${KB_TEST_ENV}")

# kb_plugin_test(NAME COMMAND...): a test that needs the installed plugin.
function(kb_plugin_test name)
  add_test(NAME ${name} COMMAND ${ARGN})
  set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED kb_plugin TIMEOUT 180
                       ENVIRONMENT "${KB_TEST_ENV}")
endfunction()

# The contract suite as a plugin's author runs it: the installed
# keybus-contract on the plugin built against the installed package.
kb_plugin_test(contract_file ${KB_PLUGIN_ROOT}/prefix/${CMAKE_INSTALL_BINDIR}/keybus-contract
               -p ${KB_PLUGIN_SO} -X file.poll_ms=20 file://${KB_PLUGIN_ROOT}/data/contract)

# Plugins that must not load, and the loading rules.
add_library(kb_plugin_bad_abi MODULE test_plugin_fixture.c)
target_compile_definitions(kb_plugin_bad_abi PRIVATE KB_FIXTURE_ABI=2)
target_include_directories(kb_plugin_bad_abi PRIVATE ${PROJECT_SOURCE_DIR}/include)
add_library(kb_plugin_no_entry MODULE test_plugin_fixture.c)
target_compile_definitions(kb_plugin_no_entry PRIVATE KB_FIXTURE_NO_ENTRY)
target_include_directories(kb_plugin_no_entry PRIVATE ${PROJECT_SOURCE_DIR}/include)
add_library(kb_plugin_marker MODULE test_plugin_fixture.c)
target_compile_definitions(kb_plugin_marker PRIVATE KB_FIXTURE_NO_ENTRY KB_FIXTURE_MARKER)
target_include_directories(kb_plugin_marker PRIVATE ${PROJECT_SOURCE_DIR}/include)
add_executable(test_plugin test_plugin.c)
target_link_libraries(test_plugin PRIVATE kb_test_support keybus::internal)
# It links the static library (for the conf-doc writer): exporting its
# symbols lets the plugin bind to this copy rather than load the installed one.
set_target_properties(test_plugin PROPERTIES ENABLE_EXPORTS ON)
kb_plugin_test(test_plugin test_plugin ${KB_PLUGIN_SO} $<TARGET_FILE:kb_plugin_bad_abi>
               $<TARGET_FILE:kb_plugin_no_entry> $<TARGET_FILE:kb_plugin_marker>)

# Consumers in two processes share a topic through file://: per-key order
# across the hand-over of partitions, nothing lost, nothing twice; a restart
# resumes at the committed offset.
add_executable(test_plugin_procs test_plugin_procs.c)
target_link_libraries(test_plugin_procs PRIVATE keybus_shared PkgConfig::CMOCKA Threads::Threads)
kb_plugin_test(plugin_two_processes test_plugin_procs ${KB_PLUGIN_SO}
               file://${KB_PLUGIN_ROOT}/data/procs)

# The installed libkeybus.so loads with dlopen(RTLD_NOW | RTLD_LOCAL) after
# the TLS hogs, as the build tree's does (test_dlopen).
kb_plugin_test(dlopen_installed test_dlopen
               ${KB_PLUGIN_ROOT}/prefix/${CMAKE_INSTALL_LIBDIR}/libkeybus.so ${KB_HOGS})

# `keybus conf-doc` documents the keys of a plugin named with -X.
add_test(NAME confdoc_plugin
         COMMAND $<TARGET_FILE:keybus> -X transport.plugins=${KB_PLUGIN_SO} conf-doc)
set_tests_properties(confdoc_plugin PROPERTIES FIXTURES_REQUIRED kb_plugin
                     PASS_REGULAR_EXPRESSION "file\\.poll_ms")
