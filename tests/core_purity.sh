#!/usr/bin/env bash
# The supervisor's core and policies are pure: no event loop, sockets, processes, clock reads,
# randomness or file system. A new #include or call that would make them otherwise fails here.
set -u
root=${1:?usage: core_purity.sh SOURCE_DIR}
files=$(ls "$root"/supervisor/core/*.h "$root"/supervisor/core/*.cc "$root"/supervisor/policy/*.h "$root"/supervisor/policy/*.cc)
forbidden='#include <uv.h>|#include <spdlog|#include <unistd.h>|#include <sys/|#include <fcntl.h>|#include <random>|#include <thread>|#include <filesystem>|#include <fstream>|#include "ipc/connection.h"|#include "ipc/blocking_channel.h"|#include "common/clock.h"|steady_clock::now|system_clock::now|std::rand|getenv|fopen|::open\('
found=$(grep -nE "$forbidden" $files)
if [ -n "$found" ]; then
  echo "the core or a policy reaches outside itself:"
  echo "$found"
  exit 1
fi
echo "supervisor/core and supervisor/policy: pure"
