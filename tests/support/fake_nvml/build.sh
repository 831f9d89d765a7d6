#!/bin/sh
# Builds the scripted NVML: build.sh OUT_DIR [SYMBOL...] writes OUT_DIR/libnvidia-ml.so.1.
# Each SYMBOL given is left out of the library's exports (plays a driver older than that call).
# Uses $CC, else cc from PATH. Called by `cargo xtask fake-nvml` and lmperf_e2e::fake_nvml.
set -eu
out=${1:?usage: build.sh OUT_DIR [SYMBOL...]}
shift
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
tmp="$out/.libnvidia-ml.so.1.$$"
vs="$out/.exports.$$"
{
    echo "{ global: nvml*;"
    echo "  local:"
    [ $# -gt 0 ] && printf '    %s;\n' "$@"
    echo "    *;"
    echo "};"
} > "$vs"
${CC:-cc} -shared -fPIC -O2 -Wall -Wextra -fvisibility=hidden \
    -Wl,--version-script="$vs" -Wl,-soname,libnvidia-ml.so.1 -Wl,-z,nodelete \
    -o "$tmp" "$src/fake_nvml.c" "$src/vendor/cjson/cJSON.c" -lpthread -lm
rm -f "$vs"
mv -f "$tmp" "$out/libnvidia-ml.so.1"
