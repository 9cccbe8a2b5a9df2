#!/usr/bin/env bash
# Find (or install) the two services of a Dynamo deployment: etcd (discovery) and nats-server
# (event plane). Prints two lines on stdout: the etcd binary, then the nats-server binary.
#
# Order: KVCORE_ETCD / KVCORE_NATS when set; then the PATH (Debian packages etcd-server and
# nats-server put them in /usr/bin and /usr/sbin); then `apt-get install -y etcd-server
# nats-server` when running as root (or with sudo) on a Debian-like system; otherwise the official
# static release binaries from GitHub, kept under ${KVCORE_FLEET_BIN:-<repo>/target/fleet-bin}.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BIN="${KVCORE_FLEET_BIN:-$REPO/target/fleet-bin}"
ETCD_VERSION="v3.5.17"
NATS_VERSION="v2.10.24"

log() { echo "[setup_services] $*" >&2; }

find_tool() { # name, extra dirs...
  local name="$1"; shift
  command -v "$name" 2>/dev/null && return 0
  for d in "$@" /usr/sbin /usr/bin; do
    [[ -x "$d/$name" ]] && { echo "$d/$name"; return 0; }
  done
  return 1
}

mkdir -p "$BIN"
if command -v flock >/dev/null; then
  exec 9>"$BIN/.lock"
  flock 9
fi

etcd="${KVCORE_ETCD:-$(find_tool etcd "$BIN" || true)}"
nats="${KVCORE_NATS:-$(find_tool nats-server "$BIN" || true)}"

if [[ -z "$etcd" || -z "$nats" ]] && command -v apt-get >/dev/null; then
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
  fi
  if [[ "$SUDO" != none ]]; then
    log "installing etcd-server nats-server with apt-get"
    # The packages' service scripts may try to start the daemons; the test starts its own.
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q etcd-server nats-server >&2; then
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -q >&2 || true
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q etcd-server nats-server >&2 || true
    fi
    etcd="${etcd:-$(find_tool etcd || true)}"
    nats="${nats:-$(find_tool nats-server || true)}"
  fi
fi

arch="$(uname -m)"
case "$arch" in x86_64) goarch=amd64 ;; aarch64) goarch=arm64 ;; *) goarch="$arch" ;; esac
if [[ -z "$etcd" ]]; then
  log "downloading etcd $ETCD_VERSION"
  tmp="$(mktemp -d)"
  url="https://github.com/etcd-io/etcd/releases/download/$ETCD_VERSION/etcd-$ETCD_VERSION-linux-$goarch.tar.gz"
  curl -fsSL "$url" | tar -xz -C "$tmp" || { log "cannot fetch $url; install etcd or set KVCORE_ETCD"; exit 1; }
  install -m 755 "$tmp/etcd-$ETCD_VERSION-linux-$goarch/etcd" "$BIN/etcd"
  rm -rf "$tmp"
  etcd="$BIN/etcd"
fi
if [[ -z "$nats" ]]; then
  log "downloading nats-server $NATS_VERSION"
  tmp="$(mktemp -d)"
  url="https://github.com/nats-io/nats-server/releases/download/$NATS_VERSION/nats-server-$NATS_VERSION-linux-$goarch.tar.gz"
  curl -fsSL "$url" | tar -xz -C "$tmp" || { log "cannot fetch $url; install nats-server or set KVCORE_NATS"; exit 1; }
  install -m 755 "$tmp/nats-server-$NATS_VERSION-linux-$goarch/nats-server" "$BIN/nats-server"
  rm -rf "$tmp"
  nats="$BIN/nats-server"
fi

"$etcd" --version >&2
"$nats" --version >&2
echo "$etcd"
echo "$nats"
