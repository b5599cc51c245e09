#!/usr/bin/env bash
# Runs as postgres (from scripts/test-citus.sh): starts a Citus coordinator
# and two workers on 127.0.0.1 in throwaway data directories under
# $WORK/cluster, distributes the extension with idem_citus_distribute(),
# runs the suites, stops the servers and prints
# "suites: N passed, M failed".
#
# CITUS_KEEP=1 leaves the cluster running (for a look around); the ports
# are in $WORK/cluster/ports.
set -uo pipefail
WORK=$1
cd "$WORK"
base=$WORK/cluster
rm -rf "$base"
mkdir -p "$base"
lib=$IDEM_DESTDIR$("$PG_CONFIG" --pkglibdir)

# three free ports in a row
for i in $(seq 1 100); do
    # below the kernel's ephemeral ports (32768 and up), which an
    # outgoing connection may hold at the moment the server binds
    p=$((20000 + RANDOM % 12000))
    free=1
    for q in $p $((p + 1)) $((p + 2)); do
        if [ -e "/var/run/postgresql/.s.PGSQL.$q" ] || [ -e "/tmp/.s.PGSQL.$q" ] ||
           (echo > "/dev/tcp/127.0.0.1/$q") 2>/dev/null; then
            free=0
        fi
    done
    [ $free -eq 1 ] && break
done
PC=$p PW1=$((p + 1)) PW2=$((p + 2))
echo "$PC $PW1 $PW2" > "$base/ports"
export PGHOST=127.0.0.1 PGUSER=postgres PGDATABASE=postgres

node_dir() { echo "$base/node-$1"; }

start_node() {
    pg_ctl -D "$(node_dir "$1")" -l "$base/node-$1.log" -w -t 60 start >/dev/null
}

stop_all() {
    for port in $PC $PW1 $PW2 ${PPLAIN:-}; do
        pg_ctl -D "$(node_dir "$port")" -m fast -w stop >/dev/null 2>&1
    done
}

for port in $PC $PW1 $PW2; do
    initdb -D "$(node_dir "$port")" -U postgres --auth=trust -E UTF8 >/dev/null || exit 1
    cat >> "$(node_dir "$port")/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
shared_preload_libraries = 'citus,idempotency'
max_connections = 200
max_prepared_transactions = 200
fsync = off
extension_destdir = '$IDEM_DESTDIR'
dynamic_library_path = '$lib:\$libdir'
citus.node_conninfo = 'sslmode=disable'
citus.shard_count = 8
citus.enable_version_checks = off
log_min_messages = warning
EOF
    start_node "$port" || { cat "$base/node-$port.log"; exit 1; }
done
if [ "${CITUS_KEEP:-}" != 1 ]; then
    trap stop_all EXIT
fi

# q PORT SQL...: run SQL on a node, unaligned, tuples only; stops at the
# first error
q() {
    local port=$1
    shift
    psql -X -q -A -t -v ON_ERROR_STOP=1 -p "$port" "$@"
}

echo "citus: coordinator on $PC, workers on $PW1 and $PW2"
setup_ok=1
for port in $PC $PW1 $PW2; do
    q "$port" -c "CREATE EXTENSION citus" || setup_ok=0
done
q "$PC" -c "SELECT citus_set_coordinator_host('127.0.0.1', $PC)" >/dev/null || setup_ok=0
q "$PC" -c "SELECT citus_add_node('127.0.0.1', $PW1)" >/dev/null || setup_ok=0
q "$PC" -c "SELECT citus_add_node('127.0.0.1', $PW2)" >/dev/null || setup_ok=0

passed=0
failed=0
failed_names=()
declare -A why

# check NAME CONDITION-DESCRIPTION: called by the suites
fail() {
    echo "  FAILED: $*"
    suite_ok=0
}

run_suite() {
    local name=$1
    local started=$SECONDS
    suite_ok=1
    echo "======== suite: $name"
    "suite_$name"
    echo "======== suite: $name took $((SECONDS - started)) s"
    if [ $suite_ok -eq 1 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failed_names+=("$name")
    fi
}

. "$WORK/scripts/citus-suites.sh"

if [ $setup_ok -eq 0 ]; then
    failed=$((failed + 1))
    failed_names+=(cluster)
else
    for s in ${CITUS_ONLY:-$CITUS_SUITES}; do
        run_suite "$s"
    done
fi

# CITUS_BENCH=1: requests per second through the coordinator, then on a
# plain server of the same build (no Citus): a figure, not a suite
if [ "${CITUS_BENCH:-}" = 1 ] && [ $failed -eq 0 ]; then
    citus_bench
fi

if [ $failed -ne 0 ]; then
    echo "failed suites: ${failed_names[*]}"
    for port in $PC $PW1 $PW2; do
        echo "======== node $port log (last 60 lines)"
        tail -n 60 "$base/node-$port.log"
    done
fi
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ]
