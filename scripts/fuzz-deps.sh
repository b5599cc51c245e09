#!/usr/bin/env bash
# The fuzzers' own dependency: the RFC 8785 reference implementation (npm
# "canonicalize", version pinned in fuzz/package.json and
# fuzz/package-lock.json), installed into fuzz/node_modules.  Needs node and
# npm (scripts/deps.sh installs Debian's when missing).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top/fuzz"
if [ -f node_modules/.package-lock.json ] &&
   [ node_modules/.package-lock.json -nt package-lock.json ] &&
   [ -f node_modules/canonicalize/package.json ]; then
    echo "fuzz-deps: node_modules up to date"
    exit 0
fi
echo "fuzz-deps: npm ci (canonicalize)"
npm ci --no-audit --no-fund --loglevel=error
