#!/usr/bin/env bash
# Supply-chain check, offline: advisories, licenses, duplicate versions, sources.
# cargo-deny reads its advisory database as a git repository under db-path; CI has no network
# to GitHub, so the offline copy in ../shared/data/advisory-db is turned into one here.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deny >/dev/null || cargo install cargo-deny --locked --version 0.20.2
# The copy sits in ../shared beside the checkout; a clone made elsewhere (`git clone . /tmp/x`)
# finds it beside the local repository it was cloned from. KVCORE_ADVISORY_DB names it outright.
src=${KVCORE_ADVISORY_DB:-../shared/data/advisory-db}
if [ ! -d "$src" ] && [ -z "${KVCORE_ADVISORY_DB:-}" ]; then
    origin=$(git remote get-url origin 2>/dev/null || true)
    if [ -n "$origin" ] && [ -d "$origin/../shared/data/advisory-db" ]; then
        src=$origin/../shared/data/advisory-db
    fi
fi
db=target/advdb/advisory-db-3157b0e258782691
if [ ! -d "$src" ]; then
    echo "deny: the offline advisory database $src is missing (set KVCORE_ADVISORY_DB)" >&2
    exit 1
fi
if [ ! -d "$db/.git" ] || ! diff -rq -x .git "$src" "$db" >/dev/null 2>&1; then
    rm -rf "$db" && mkdir -p target/advdb && cp -r "$src" "$db"
    git -C "$db" init -q
    git -C "$db" add -A
    git -C "$db" -c user.email=ci@local -c user.name=ci commit -qm "offline advisory db"
fi
cargo fetch --locked >/dev/null
cargo deny --offline check advisories licenses bans sources
