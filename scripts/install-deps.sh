#!/usr/bin/env bash
# Installs the Debian 12 packages warmpool builds with, when any is missing. Nothing is downloaded
# at build or run time; this is the only step that needs the package archive.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libuv1-dev libprotobuf-dev protobuf-compiler libfmt-dev libspdlog-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev libgtest-dev
  ocl-icd-opencl-dev  # dnnl's CMake package looks for OpenCL (only recommended by libdnnl-dev)
  libsystemd-dev systemd clang libclang-rt-14-dev libomp-dev  # libomp: the fuzz build (clang) with OpenMP
  python3  # scripts/gpu-check.sh writes its summary with it
  libhttp-parser-dev  # the HTTP/JSON API's request parser
  python3-protobuf python3-numpy python3-pytest python3-setuptools python3-wheel python3-pip python3-venv  # python/ and its tests
  prometheus curl tmux  # tests: a real Prometheus scrapes warmpoold; curl examples; `warmpool top` under tmux
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: run as root or install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
