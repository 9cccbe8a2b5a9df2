#!/usr/bin/env bash
# Create (or reuse) a virtualenv holding NVIDIA Dynamo's runtime wheel from PyPI,
# for the interop test and benchmark in this directory.
#
#   venv path : ${KVCORE_DYNAMO_VENV:-<repo>/target/dynamo-venv}
#   python    : ${KVCORE_PYTHON:-python3}   (3.10+; tested with 3.11)
#
# The last line of stdout is the venv's python path. Everything else goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${KVCORE_DYNAMO_VENV:-$REPO/target/dynamo-venv}"
PY="${KVCORE_PYTHON:-python3}"
DYNAMO_VERSION="1.6.1"
# Pinned extras: msgpack for the wire format, pyzmq for the test publisher,
# xxhash to cross-check the block key formula. The wheel itself has no dependencies
# we use from Python (its Rust core embeds ZMQ, msgpack and xxh3).
PKGS=("ai-dynamo-runtime==${DYNAMO_VERSION}" "msgpack>=1.0" "pyzmq>=25" "xxhash>=3")
STAMP="$VENV/.kvcore-dynamo-${DYNAMO_VERSION}"

log() { echo "[setup_venv] $*" >&2; }

# One setup at a time: tests running in parallel (or two test binaries) would
# otherwise create and pip-install into the same venv at once, and the one
# that finds it half made fails.
mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null; then
  exec 9>"$VENV.lock"
  flock 9
fi

if [[ -x "$VENV/bin/python" && -f "$STAMP" ]] \
   && "$VENV/bin/python" -c 'import dynamo.llm, msgpack, zmq, xxhash' >/dev/null 2>&1; then
  log "reusing $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv at $VENV with $PY ($("$PY" --version 2>&1))"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" >&2
fi

log "installing ${PKGS[*]}"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2

"$VENV/bin/python" -c 'import dynamo.llm, msgpack, zmq, xxhash' >&2
touch "$STAMP"
log "ready: $VENV"
echo "$VENV/bin/python"
