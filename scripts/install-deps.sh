#!/usr/bin/env bash
# Installs the Debian 12 packages warmpool needs, when any is missing. Nothing is downloaded at
# build or run time; this is the only step that needs the package archive.
#   scripts/install-deps.sh          what building and running the product needs (scripts/demo.sh)
#   scripts/install-deps.sh --test   and the test tools (scripts/test.sh): GoogleTest, clang for the
#                                    fuzz targets, pytest, Prometheus, tmux, systemd's analyzers,
#                                    groff and mandoc
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libuv1-dev libprotobuf-dev protobuf-compiler libfmt-dev libspdlog-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libopenblas-dev libdnnl-dev
  ocl-icd-opencl-dev  # dnnl's CMake package looks for OpenCL (only recommended by libdnnl-dev)
  libsystemd-dev      # sd_notify and socket activation
  libhttp-parser-dev  # the HTTP API's request parser
  libpcre2-dev        # tokenizers' pre-tokenizer patterns (Unicode classes, lookahead)
  libutf8proc-dev     # tokenizers' Unicode normalization (NFC)
  python3 python3-protobuf python3-numpy python3-setuptools python3-wheel python3-pip python3-venv  # python/
  curl                # the quick start's HTTP example
)
case "${1:-}" in
  "") ;;
  --test)
    packages+=(
      libgtest-dev
      clang libclang-rt-14-dev libomp-dev  # the fuzz targets (libFuzzer), with OpenMP for oneDNN
      python3-pytest
      python3-regex       # the tokenizer reference's patterns (tests/python/tokenizer_reference.py)
      python3-jinja2      # chat templates rendered by Jinja itself, against the interpreter (tests/python/jinja_reference.py)
      systemd             # systemd-analyze verify of the units
      prometheus tmux     # a real Prometheus scrapes warmpoold; `warmpool top` under tmux
      groff-base mandoc   # the man pages render without a warning (tests/docs/man_pages_test.sh)
    ) ;;
  -h | --help) sed -n '2,6p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac

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
