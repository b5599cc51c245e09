#!/usr/bin/env bash
# Install what t/070_monitoring.pl needs on Debian 12, skipping what is
# already there: prometheus-postgres-exporter (the exporter the test runs
# with queries.yaml) and prometheus (promtool, which checks alerts.yml and
# runs alerts_test.yml).  Run as root.
set -euo pipefail

packages=(
    prometheus-postgres-exporter
    prometheus                      # promtool
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "monitoring/deps: all packages present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "monitoring/deps: missing packages: ${missing[*]}" >&2
    echo "monitoring/deps: run as root (or install them) and try again" >&2
    exit 1
fi

echo "monitoring/deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# the packages start services of their own (ports 9187 and 9090); the test
# starts its exporter on a free port and needs neither
if command -v service >/dev/null; then
    for p in "${missing[@]}"; do
        service "$p" stop >/dev/null 2>&1 || true
    done
fi
echo "monitoring/deps: done"
