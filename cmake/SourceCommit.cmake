# Run at every build (cli/CMakeLists.txt): writes OUT, a source file defining
# dp::launcher::kSourceCommit, the commit the tree was built from ("1a2b3c4d5e6f", with
# ", modified" when files differ from it; "unknown" outside a git checkout). OUT is rewritten only
# when that changes, so a build of the same commit recompiles nothing and ccache keeps serving the
# rest: only this one small file depends on the commit.
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${SRC}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head RESULT_VARIABLE failed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT failed AND head)
    set(commit "${head}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(changes)
      set(commit "${commit}, modified")
    endif()
  endif()
endif()
set(text "// Generated at build time by cmake/SourceCommit.cmake.\nnamespace dp::launcher {\nextern const char* const kSourceCommit = \"${commit}\";\n}  // namespace dp::launcher\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE "${OUT}" "${text}")
endif()
