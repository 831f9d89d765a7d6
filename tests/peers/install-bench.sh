#!/usr/bin/env bash
# Installs the Python peers of the client benchmark (cargo xtask bench-client): GuideLLM and
# AIPerf, each in its own venv under ${LMPERF_BENCH_VENV:-<repo>/.venv-bench}, and a Gemma 3
# tokenizer directory (<venv-bench>/tokenizer) built from the test model's GGUF metadata
# (tests/peers/install.sh assembles it), since the peers cannot reach the Hugging Face hub.
# Idempotent: re-running only checks the stamps.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
base="${LMPERF_BENCH_VENV:-$root/.venv-bench}"
python="${PYTHON:-python3}"
gguf="$root/.venv-peers/models/gemma-3-270m-q4_k_m.gguf"

die() { echo "peers/install-bench.sh: $*" >&2; exit 1; }

for peer in guidellm aiperf; do
    venv="$base/$peer"
    req="$here/bench-$peer.txt"
    stamp="$venv/.requirements.sha256"
    [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv" || die "could not create venv at $venv"
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if [[ "$want" != "$(cat "$stamp" 2>/dev/null || true)" ]]; then
        echo "installing $peer into $venv (GuideLLM pulls torch: several GB)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" \
            || die "pip install of $peer failed"
        echo "$want" > "$stamp"
    fi
    [[ -x "$venv/bin/$peer" ]] || die "$venv/bin/$peer missing"
done

tok="$base/tokenizer"
if [[ ! -s "$tok/tokenizer.json" ]]; then
    [[ -f "$gguf" ]] || die "$gguf missing: run tests/peers/install.sh first"
    "$base/aiperf/bin/python" "$here/gguf-tokenizer.py" "$gguf" "$tok" || die "could not build the tokenizer"
fi
echo "bench peers installed in $base (tokenizer: $tok)"
