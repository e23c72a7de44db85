# Sourced by the scripts in this folder: cd to the repository root, job count (DHISPARSE_JOBS,
# default nproc), nvcc and GPU detection, Debian package installation.
# shellcheck shell=bash

DHISPARSE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$DHISPARSE_ROOT" || exit 1

DHISPARSE_JOBS=${DHISPARSE_JOBS:-$(nproc 2>/dev/null || echo 2)}

# The CUDA toolkit is often installed without being on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH="/usr/local/cuda/bin:$PATH"
fi

# copy_benchmark_library BINARY DIR: copy the Google Benchmark shared library BINARY links into DIR
# (the GPU machine may lack it; set LD_LIBRARY_PATH to DIR there).
copy_benchmark_library() {
  mkdir -p "$2"
  ldd "$1" | awk '/libbenchmark/ {print $3}' | xargs -r -I{} cp -L {} "$2/"
}

have_nvcc() { [ -n "${CUDACXX:-}" ] || command -v nvcc >/dev/null 2>&1; }
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# install_debian_packages PKG...: apt-get install those not installed (root only; no-op otherwise).
install_debian_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: missing packages ${missing[*]} (install them, or run as root on Debian/Ubuntu)" >&2
    return 0
  fi
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
