# Included by the top-level CMakeLists.txt when WARMPOOL_FUZZ is on, before any library is defined:
# every library is built with coverage instrumentation for libFuzzer and with AddressSanitizer and
# UndefinedBehaviorSanitizer. The fuzz targets themselves link with -fsanitize=fuzzer (fuzz/).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "WARMPOOL_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++ "
                      "(the compiler is ${CMAKE_CXX_COMPILER_ID}); see fuzz/README.md")
endif()
# Debug information as the build type says: scripts/fuzz.sh's own build is RelWithDebInfo, the test
# command's sanitizer build (which these targets share) has line tables only.
# C and C++ only: nvcc hands its options to the host compiler, gcc, which has no libFuzzer.
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined>"
                    "$<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
# Any other executable of the tree still links (the sanitizer runtimes provide the coverage hooks).
add_link_options(-fsanitize=address,undefined)
