#!/usr/bin/env bash
# Installs the serving-path peers (issue 36): NVIDIA Dynamo 1.6.1 (frontend with the KV router,
# mocker workers) and vllm-router 0.1.17, into ${LMPERF_SERVING_VENV:-<repo>/.venv-serving}
# on Python 3.11 (ai-dynamo-runtime ships cp310+ abi3 wheels; the e2e tests start them on CPU).
# ai-dynamo itself goes in with --no-deps: its aisimulate dependency downloads from an index
# not reachable here and the frontend and the mocker do not import it.
# Idempotent: re-running only checks the stamp and the imports.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${LMPERF_SERVING_VENV:-$root/.venv-serving}"
# A worktree links .venv-serving to the main checkout's: venv cannot create through the link.
[[ -L "$venv" ]] && venv="$(readlink -f "$venv")"
req="$here/serving.txt"
stamp="$venv/.requirements.sha256"
dynamo="ai-dynamo==1.6.1"
python="${PYTHON:-python3.11}"

die() { echo "peers/install-serving.sh: $*" >&2; exit 1; }

if [[ ! -x "$venv/bin/python" ]]; then
    command -v "$python" >/dev/null || die "$python not found (set PYTHON to a Python 3.11)"
    "$python" -m venv "$venv" || die "could not create venv at $venv"
fi

want="$(sha256sum "$req" | cut -d' ' -f1) $dynamo"
if [[ "$want" != "$(cat "$stamp" 2>/dev/null || true)" ]]; then
    echo "installing Dynamo and vllm-router into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" \
        || die "pip install -r $req failed"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps "$dynamo" \
        || die "pip install --no-deps $dynamo failed"
    echo "$want" > "$stamp"
fi

"$venv/bin/python" -c 'import dynamo.frontend, dynamo.mocker' || die "dynamo.frontend / dynamo.mocker do not import"
[[ -x "$venv/bin/vllm-router" ]] || die "$venv/bin/vllm-router missing"
# The mocker's model directory (config.json from the test model's GGUF metadata, the tokenizer
# install.sh built, Gemma 3's chat template), made with .venv-peers' gguf package.
peers="$root/.venv-peers"
model="$venv/model"
if [[ ! -s "$model/config.json" ]]; then
    [[ -s "$peers/tokenizer/tokenizer.json" ]] || die "$peers/tokenizer missing: run tests/peers/install.sh first"
    "$peers/bin/python" "$here/gguf-model-dir.py" "$peers/models/gemma-3-270m-q4_k_m.gguf" "$peers/tokenizer" \
        "$root/tests/fixtures/chat_templates/gemma3/tokenizer_config.json" "$model" \
        || die "could not write the mocker's model directory $model"
fi
echo "serving peers installed in $venv (mocker model: $model)"
