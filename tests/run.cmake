# Shared by the cmake -P scripts of the tests (plugin_install.cmake,
# package.cmake).
# kb_require(VAR...): each -DVAR=... was given.
function(kb_require)
  foreach(var ${ARGN})
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "${CMAKE_SCRIPT_MODE_FILE}: -D${var}=... is missing")
    endif()
  endforeach()
endfunction()

# run(WHAT COMMAND...): run it, fail with its output unless it exits 0; its
# output in run_output.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
