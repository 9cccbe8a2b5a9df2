#!/usr/bin/env bash
# Create (or reuse) a small virtualenv that runs vLLM 0.33.0's own KV event
# decoder (vllm_decoder.py), and fetch that decoder's source, one member of
# the vllm wheel on PyPI, by HTTP range requests (about 0.7 MB of the 336 MB
# wheel). Nothing of vLLM is installed: only msgspec, which the decoder needs.
#
#   venv path : ${KVCORE_VLLM_VENV:-<repo>/target/vllm-decoder-venv}
#   cache     : <venv>/cache/vllm-0.33.0/kv_events.py
#   python    : ${KVCORE_PYTHON:-python3}   (3.10+)
#
# The last line of stdout is the venv's python path. Everything else goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${KVCORE_VLLM_VENV:-$REPO/target/vllm-decoder-venv}"
PY="${KVCORE_PYTHON:-python3}"
PKGS=("msgspec>=0.18")
STAMP="$VENV/.kvcore-vllm-decoder-0.33.0"

log() { echo "[setup_vllm_decoder] $*" >&2; }

mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null; then
  exec 9>"$VENV.lock"
  flock 9
fi

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]] && "$VENV/bin/python" -c 'import msgspec' >/dev/null 2>&1; then
  log "reusing $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv at $VENV with $PY ($("$PY" --version 2>&1))"
  "$PY" -m venv "$VENV" >&2
fi
log "installing ${PKGS[*]}"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2
"$VENV/bin/python" "$HERE/vllm_decoder.py" --cache "$VENV/cache" --fetch-only >&2
touch "$STAMP"
log "ready: $VENV"
echo "$VENV/bin/python"
