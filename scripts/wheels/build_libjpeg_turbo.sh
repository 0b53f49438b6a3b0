#!/usr/bin/env bash
# Build libjpeg-turbo's libjpeg API as a static, position-independent library with its SIMD
# code, installed under PREFIX (include/ and lib/libjpeg.a), for release wheels
# (scripts/wheels/cibuildwheel.toml). Needs cmake, nasm (x86) and a C compiler.
#   bash scripts/wheels/build_libjpeg_turbo.sh /opt/libjpeg-turbo
set -euo pipefail
prefix=${1:?usage: build_libjpeg_turbo.sh PREFIX}
version=${LIBJPEG_TURBO_VERSION:-3.0.4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
url=https://github.com/libjpeg-turbo/libjpeg-turbo/releases/download/$version/libjpeg-turbo-$version.tar.gz
curl -fsSL "$url" | tar -xz -C "$work"
cmake -S "$work/libjpeg-turbo-$version" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_TURBOJPEG=OFF \
    -DREQUIRE_SIMD=ON  # a wheel without SIMD would decode several times slower
cmake --build "$work/build" --parallel
cmake --install "$work/build"
test -f "$prefix/lib/libjpeg.a" && test -f "$prefix/include/jpeglib.h"
