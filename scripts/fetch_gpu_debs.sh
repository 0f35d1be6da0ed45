#!/usr/bin/env bash
# Downloads (does not install) the Debian packages whose headers and libraries the build needs into .debs/, so
# they can travel to a machine without apt (a GPU machine that has a CUDA PyTorch but no Debian -dev packages).
# scripts/gpu_check.sh unpacks them there. Run from the repository root on a Debian 12 machine.
set -euo pipefail
mkdir -p .debs
grep -qx '/.debs/' .git/info/exclude 2>/dev/null || echo '/.debs/' >> .git/info/exclude
cd .debs
apt-get download nlohmann-json3-dev libfmt-dev libfmt9 libcli11-dev libgtest-dev libsentencepiece-dev \
  libsentencepiece0 libprotobuf-lite32 libprotobuf32 \
  libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libyaml-cpp-dev libyaml-cpp0.7 zlib1g-dev libbz2-dev \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev
ls -la
