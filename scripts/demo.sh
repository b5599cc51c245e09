#!/usr/bin/env bash
# make demo: install what is missing, build, install, start a throwaway
# cluster and walk through the extension step by step.  Run as root.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/lib.sh"

prepare_server
stage_tree "$top"
echo "demo: building in $WORK"
build_and_install ""
cluster_options
echo "demo: starting a throwaway cluster (removed when the demo ends)"
rc=0
with_cluster bash "$WORK/scripts/demo-cluster.sh" "$WORK" || rc=$?
rm -rf "$WORK"
exit $rc
