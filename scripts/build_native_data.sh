#!/usr/bin/env bash
# Builds the Parquet column kernels (data/parquet/native/columns.c, the id hash in
# id_hash.h) into data/parquet/native/libdlrm_columns.so, or into $1. Called by
# `make native-data` (which `make install` depends on), scripts/install.sh and
# scripts/install_wheelhouse.sh. Without a C compiler ($CC, default cc) it says so and
# succeeds: the loader then converts with numpy, about half as fast (docs/data.md).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
source_dir="$here/data/parquet/native"
output="${1:-$source_dir/libdlrm_columns.so}"
cc="${CC:-cc}"
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "native-data: no C compiler ($cc): the Parquet column kernels are not built; the loader converts with numpy" >&2
  exit 0
fi
# Built beside the output and renamed: a process that has the old library loaded keeps it.
"$cc" -O3 -std=c11 -Wall -Wextra -Werror -fPIC -shared -o "$output.tmp" "$source_dir/columns.c" -lm
mv -f "$output.tmp" "$output"
echo "native-data: built $output"
