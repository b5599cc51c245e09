# Sourced by scripts/citus-suite.sh, which provides q PORT ARGS... (psql on
# a node), fail MESSAGE, the ports PC (coordinator), PW1 and PW2 (workers),
# node_dir PORT, start_node PORT and $base (the cluster's directory).  Each
# suite_NAME is one suite; they run in this order and build on each other.
CITUS_SUITES="distribute lifecycle payments storm outbox maintenance move restart"

# The port of the node holding the shard of tenant $1.
# psql on the coordinator as citus_bound (bound to acme), SET ROLE to
# citus_free (bound to no tenant), then the given commands
as_free() {
    psql -X -q -A -t -p "$PC" -U citus_bound -c "SET ROLE citus_free" "$@"
}

# a temporary SQL function pg_temp.w(tenant) the planner inlines into
# idem_reserve(tenant, 'bound', KEY, '{}')
wrapper() {
    echo "CREATE FUNCTION pg_temp.w(t text) RETURNS idempotency.reservation LANGUAGE sql AS \$\$ SELECT idem_reserve(t, 'bound', '$1', '{}') \$\$"
}

shard_port() {
    q "$PC" -c "SELECT nodeport FROM pg_catalog.pg_dist_shard_placement
                 WHERE shardid = get_shard_id_for_distribution_column('idempotency.keys', '$1')"
}

# The ports Citus sent commands to while psql ran the statements on the
# coordinator (citus.log_remote_commands), sorted and unique, one a line;
# the statements' output is in $base/routed.out.
routed_ports() {
    { echo "SET citus.log_remote_commands = on;"; cat; } |
        psql -X -q -A -t -v ON_ERROR_STOP=1 -p "$PC" >"$base/routed.out" 2>"$base/routed.log"
    local rc=$?
    sed -n -E 's/.*on server [^ ]*:([0-9]+) .*/\1/p' "$base/routed.log" | sort -u
    return $rc
}

# The outcome of a reservation printed as a record: "(created,,...)" -> created
outcome() {
    sed -E 's/^\(([a-z_]+),.*/\1/'
}

# The lock token in a reservation printed as a record
token() {
    grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
}

suite_distribute() {
    q "$PC" -c "CREATE EXTENSION idempotency" || { fail "CREATE EXTENSION idempotency"; return; }
    # outbox rows enqueued before the tables are distributed: their ids
    # stay theirs, and the workers' sequences go past them
    q "$PC" -c "SELECT outbox_enqueue('pre' || g, 'pre.topic', '{}') FROM generate_series(1, 5) g" >/dev/null ||
        fail "enqueue before distributing"
    # and ids given to rows delivered and deleted before (6 to 8): relays
    # have seen them, so they never come again either
    q "$PC" -c "SELECT outbox_enqueue('gone' || g, 'gone.topic', '{}') FROM generate_series(1, 3) g" \
         -c "DELETE FROM idempotency.outbox WHERE topic = 'gone.topic'" >/dev/null ||
        fail "enqueue and delete before distributing"
    # a worker whose sequence cannot go past those ids (8): refused with
    # 55000, naming the worker, and nothing is distributed
    local err
    q "$PW1" -c "ALTER SEQUENCE idempotency.outbox_id_seq MAXVALUE 3" >/dev/null ||
        fail "ALTER SEQUENCE on a worker"
    err=$(q "$PC" -v VERBOSITY=verbose -c "SELECT idem_citus_distribute()" 2>&1)
    case $err in
        *"55000: could not move the outbox id sequence of every worker past 8"*"127.0.0.1:$PW1 "*) ;;
        *) fail "idem_citus_distribute() with a worker's sequence stuck: $err" ;;
    esac
    case $err in *":$PW2 "*) fail "idem_citus_distribute() named a worker that succeeded: $err" ;; esac
    err=$(q "$PC" -c "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idempotency.%'")
    [ "$err" = 0 ] || fail "tables distributed by the refused idem_citus_distribute(): $err"
    q "$PW1" -c "ALTER SEQUENCE idempotency.outbox_id_seq NO MAXVALUE" >/dev/null ||
        fail "ALTER SEQUENCE on a worker, back"
    q "$PC" -c "SELECT idem_citus_distribute()" >/dev/null || { fail "idem_citus_distribute()"; return; }
    local pre
    # (each call a statement of its own, which Citus delegates)
    pre=$(for i in 1 2 3 4 5; do echo "SELECT outbox_enqueue('pre$i', 'pre.topic', '{}');"; done | q "$PC" 2>&1)
    [ "$(echo "$pre" | awk '$1 > 8' | wc -l)" = 5 ] ||
        fail "enqueue after distributing rows enqueued before: $pre"
    pre=$(q "$PC" -c "SELECT count(*) || ' ' || count(DISTINCT (tenant_id, id)) FROM idempotency.outbox WHERE topic = 'pre.topic'")
    [ "$pre" = "10 10" ] || fail "outbox rows before and after distributing: $pre"
    q "$PC" -c "DELETE FROM idempotency.outbox WHERE topic = 'pre.topic'" >/dev/null
    # running it again finishes what is missing: nothing
    q "$PC" -c "SELECT idem_citus_distribute()" >/dev/null || fail "idem_citus_distribute() a second time"
    # the setting it needs for the reference tables' triggers does not stay
    # on for the rest of the caller's transaction
    err=$(printf '%s\n' "BEGIN;" "SELECT idem_citus_distribute();" \
              "SELECT current_setting('citus.enable_unsafe_triggers');" "COMMIT;" | q "$PC" 2>&1 | tail -n 1)
    [ "$err" = off ] || fail "citus.enable_unsafe_triggers after idem_citus_distribute(): $err"
    # on a worker: refused, saying where to run it
    err=$(q "$PW1" -v VERBOSITY=verbose -c "SELECT idem_citus_distribute()" 2>&1)
    case $err in *"55000: idem_citus_distribute runs on the Citus coordinator"*) ;;
        *) fail "idem_citus_distribute() on a worker: $err" ;; esac
    err=$(q "$PC" -c "SELECT idem_citus_distribute(0)" 2>&1)
    case $err in *"shard_count must be positive"*) ;; *) fail "idem_citus_distribute(0): $err" ;; esac
    local got
    got=$(q "$PC" -c "SELECT logicalrelid::text || ' ' || partmethod::text || ' ' ||
                             (colocationid = (SELECT colocationid FROM pg_dist_partition
                                               WHERE logicalrelid = 'idempotency.keys'::regclass))
                        FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idempotency.%'
                       ORDER BY 1")
    [ "$got" = "idempotency.keys h true
idempotency.outbox h true
idempotency.scopes n false
idempotency.tenant_bindings n false" ] || fail "distribution: $got"
    got=$(q "$PC" -c "SELECT count(*) FROM pg_dist_object
                       WHERE classid = 'pg_proc'::regclass AND distribution_argument_index = 0
                         AND force_delegation AND colocationid = (SELECT colocationid FROM pg_dist_partition
                                               WHERE logicalrelid = 'idempotency.keys'::regclass)
                         AND objid::regproc::text IN ('idem_reserve', 'idem_complete', 'idem_execute',
                                                      'outbox_enqueue', 'idem_checkpoint', 'idem_release')")
    [ "$got" = 6 ] || fail "delegated key and outbox functions: $got of 6"
    # both workers hold shards
    got=$(q "$PC" -c "SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement
                       WHERE shardid IN (SELECT shardid FROM pg_dist_shard
                                          WHERE logicalrelid = 'idempotency.keys'::regclass)")
    [ "$got" = 2 ] || fail "keys' shards on $got nodes"

    # an application table colocated with the keys, and a request handler
    q "$PC" >/dev/null <<'SQL' || fail "application table and handler"
CREATE TABLE charges (
    tenant_id text COLLATE "C" NOT NULL,
    idem_key  text NOT NULL,
    amount    int NOT NULL,
    node      int NOT NULL DEFAULT pg_catalog.inet_server_port()
);
SELECT create_distributed_table('charges', 'tenant_id', colocate_with => 'idempotency.keys');
CREATE FUNCTION charge_handler(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.charges (tenant_id, idem_key, amount)
    VALUES (tenant, key, (request ->> 'amount')::int);
    -- a request takes a while: duplicates meet their first attempt running
    PERFORM pg_catalog.pg_sleep(0.01);
    RETURN ROW(201, jsonb_build_object('charged', key), NULL)::idempotency.response;
END
$$;
SELECT create_distributed_function('charge_handler(text, text, jsonb)', 'tenant',
                                   colocate_with => 'idempotency.keys');
SQL
    # Citus records the keys' colocation group under the default collation:
    # another table distributed by a text column of the default collation
    # with the default colocation is refused; with its own group it works
    q "$PC" -c "CREATE TABLE other_default (tenant_id text NOT NULL)" >/dev/null
    got=$(q "$PC" -c "SELECT create_distributed_table('other_default', 'tenant_id')" 2>&1)
    case $got in *"cannot colocate tables"*) ;; *) fail "a table of the default collation, default colocation: $got" ;; esac
    q "$PC" -c "SELECT create_distributed_table('other_default', 'tenant_id', colocate_with => 'none')" >/dev/null ||
        fail "a table of the default collation in a colocation group of its own"
}

suite_lifecycle() {
    local port ports got shard tok t
    port=$(shard_port acme)
    echo "  tenant acme lives on $port"
    ports=$(echo "SELECT idem_reserve('acme', 'charge', 'k1', '{\"amount\": 5}');" | routed_ports) ||
        { fail "idem_reserve: $(cat "$base/routed.log")"; return; }
    got=$(outcome <"$base/routed.out")
    [ "$got" = created ] || fail "first reserve: $got"
    [ "$ports" = "$port" ] || fail "first reserve ran on [$ports], not on $port alone"
    tok=$(token <"$base/routed.out")
    ports=$(echo "SELECT idem_complete('acme', 'charge', 'k1', 201, '{\"id\": \"ch_1\"}', lock_token => '$tok');" | routed_ports) ||
        { fail "idem_complete: $(cat "$base/routed.log")"; return; }
    [ "$(cat "$base/routed.out")" = succeeded ] || fail "complete: $(cat "$base/routed.out")"
    [ "$ports" = "$port" ] || fail "complete ran on [$ports], not on $port alone"
    # the retry is answered from the key's row in the worker's shard
    ports=$(echo "SELECT idem_reserve('acme', 'charge', 'k1', '{\"amount\": 5}');" | routed_ports) ||
        { fail "retry: $(cat "$base/routed.log")"; return; }
    got=$(cat "$base/routed.out")
    [ "$(echo "$got" | outcome)" = replay ] || fail "retry: $got"
    case $got in *'ch_1'*) ;; *) fail "retry does not replay the response: $got" ;; esac
    [ "$ports" = "$port" ] || fail "retry ran on [$ports], not on $port alone"
    got=$(q "$PC" -c "SELECT idem_reserve('acme', 'charge', 'k1', '{\"amount\": 6}')" | outcome)
    [ "$got" = mismatch ] || fail "another request with the same key: $got"
    # the row is in the shard, on that worker
    shard=$(q "$PC" -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', 'acme')")
    got=$(q "$port" -c "SELECT status FROM idempotency.keys_$shard WHERE tenant_id = 'acme' AND idem_key = 'k1'")
    [ "$got" = succeeded ] || fail "row in idempotency.keys_$shard on $port: '$got'"

    # in_progress: a first attempt holds the key in an open transaction on
    # the worker; a duplicate meanwhile is answered at once
    mkfifo "$base/hold"
    psql -X -q -A -t -p "$PC" <"$base/hold" >"$base/hold.out" 2>&1 &
    local holder=$!
    exec 7>"$base/hold"
    echo "BEGIN; SELECT idem_reserve('acme', 'charge', 'k2', '{\"amount\": 1}');" >&7
    # until the worker holds the key's lock (the extension's advisory lock class)
    for _ in $(seq 1 100); do
        got=$(q "$port" -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                             AND granted AND objsubid = 18756" 2>/dev/null)
        [ "${got:-0}" -ge 1 ] && break
        sleep 0.1
    done
    got=$(q "$PC" -c "SELECT idem_reserve('acme', 'charge', 'k2', '{\"amount\": 1}')" | outcome)
    [ "$got" = in_progress ] || fail "duplicate of an open attempt: $got"
    echo "SELECT idem_complete('acme', 'charge', 'k2', 200, '{}'); COMMIT;" >&7
    exec 7>&-
    wait $holder
    rm -f "$base/hold"
    got=$(q "$PC" -c "SELECT idem_reserve('acme', 'charge', 'k2', '{\"amount\": 1}')" | outcome)
    [ "$got" = replay ] || fail "after the first attempt committed: $got ($(cat "$base/hold.out"))"

    # a role bound to a tenant is held to it on the workers too:
    # tenant_bindings is a reference table, read on the worker's placement
    q "$PC" -c "CREATE ROLE citus_bound LOGIN" -c "GRANT idempotency_app TO citus_bound" \
        -c "SELECT idem_bind_tenant('citus_bound', 'acme')" >/dev/null || fail "binding a role"
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT idem_reserve('acme', 'bound', 'b1', '{}')" | outcome)
    [ "$got" = created ] || fail "the bound role for its own tenant: $got"
    for t in acme2 globex initech; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT idem_reserve('$t', 'bound', 'b1', '{}')" 2>&1)
        case $got in *"is bound to tenant \"acme\""*) ;; *) fail "the bound role for tenant $t: $got" ;; esac
    done

    # the coordinator checks a call before Citus delegates it, with what
    # only it knows: the session user (under SET ROLE to a role bound to no
    # tenant) and the session's idempotency.tenant; with parameters too, in
    # custom and generic plans
    q "$PC" -c "CREATE ROLE citus_free LOGIN" -c "GRANT idempotency_app TO citus_free" \
        -c "GRANT citus_free TO citus_bound" >/dev/null || fail "an unbound role"
    got=$(as_free \
               -c "SELECT idem_reserve('globex', 'bound', 'sr1', '{}')" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "SET ROLE out of a binding: $got" ;; esac
    got=$(for i in 1 2 3 4 5 6 7 8; do
              echo "SELECT count(*) FROM (SELECT 1) x WHERE false;"
              echo "EXECUTE r('globex', 'sp$i');"
          done | as_free \
               -c "PREPARE r(text, text) AS SELECT idem_reserve(\$1, 'bound', \$2, '{}')" -f - 2>&1 |
          grep -c 'is bound to tenant "acme"')
    # (each execution, and each statement between them)
    [ "$got" = 16 ] || fail "SET ROLE out of a binding, prepared: refused $got times of 16"
    got=$(q "$PC" -c "BEGIN" -c "SET LOCAL idempotency.tenant = 'acme'" \
               -c "SELECT idem_reserve('globex', 'bound', 'st1', '{}')" -c "COMMIT" 2>&1)
    case $got in *"does not match idempotency.tenant"*) ;; *) fail "idempotency.tenant through the coordinator: $got" ;; esac
    # ...in every shape Citus delegates: a call in FROM, a varchar tenant (a
    # literal, or a parameter as JDBC's setString sends it), an expression
    # the planner folds to the tenant
    local shape
    for shape in "SELECT * FROM idem_reserve('globex', 'bound', 'sf1', '{}')" \
                 "SELECT status FROM idem_lookup('globex', 'bound', 'sf1')" \
                 "SELECT idem_reserve('globex'::varchar, 'bound', 'sv1', '{}')" \
                 "SELECT idem_reserve(lower('GLOBEX'), 'bound', 'se1', '{}')" \
                 "SELECT * FROM outbox_enqueue('glo' || 'bex', 'topic', '{}')"; do
        got=$(as_free -c "$shape" 2>&1)
        case $got in *"is bound to tenant \"acme\""*) ;; *) fail "SET ROLE out of a binding, $shape: $got" ;; esac
    done
    got=$(as_free \
               -c "PREPARE v(varchar) AS SELECT * FROM idem_reserve(\$1, 'bound', 'sv2', '{}')" \
               -c "EXECUTE v('globex')" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "SET ROLE out of a binding, varchar parameter: $got" ;; esac
    # Citus ships statements, and calls of functions it distributes, to the
    # workers as the current role alone: a session that SET ROLEs out of
    # its binding runs nothing on the coordinator, whatever the statement
    # (an application's distributed function that reserves, a call of ours
    # over a distributed table, another expression riding on a call for
    # the role's own tenant, a plan cached before the SET ROLE, a CALL)
    q "$PC" -c "CREATE FUNCTION public.citus_place(tenant text, key text) RETURNS text LANGUAGE plpgsql AS \$\$ BEGIN RETURN (SELECT outcome::text FROM idem_reserve(tenant, 'bound', key, '{}')); END \$\$" \
        -c "SELECT create_distributed_function('citus_place(text, text)', 'tenant', colocate_with => 'idempotency.keys', force_delegation => true)" >/dev/null ||
        fail "a distributed function of the application"
    for shape in "SELECT public.citus_place('globex', 'sd1')" \
                 "SELECT (idem_reserve(tenant_id, 'bound', 'sd2', '{}')).outcome FROM charges WHERE tenant_id = 'globex'" \
                 "SELECT l.status, query_to_xml('SELECT 1', false, false, '') FROM idem_lookup('acme', 'bound', 'b1') l" \
                 "SELECT 1"; do
        got=$(as_free -c "$shape" 2>&1)
        case $got in *"is bound to tenant \"acme\": on Citus"*) ;; *) fail "a statement under SET ROLE out of a binding, $shape: $got" ;; esac
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound \
               -c "PREPARE c AS SELECT * FROM idem_lookup('acme', 'bound', 'b1')" -c "EXECUTE c" \
               -c "SET ROLE citus_free" -c "EXECUTE c" 2>&1)
    case $got in *"on Citus its session cannot run"*) ;; *) fail "a plan cached before SET ROLE: $got" ;; esac
    got=$(as_free -c "CREATE PROCEDURE pg_temp.nothing() LANGUAGE plpgsql AS \$\$ BEGIN END \$\$" \
                  -c "CALL pg_temp.nothing()" 2>&1)
    case $got in *"on Citus its session cannot run"*) ;; *) fail "a CALL under SET ROLE out of a binding: $got" ;; esac
    # ...nor from a cursor declared before the SET ROLE, nor COPY, nor as
    # the owner of a SECURITY DEFINER function who may log in and is not
    # bound to the tenant (one who may not log in runs: Citus cannot
    # connect as it)
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "BEGIN" \
               -c "DECLARE cur CURSOR FOR SELECT * FROM idem_lookup('acme', 'bound', 'b1')" \
               -c "SET LOCAL ROLE citus_free" -c "FETCH ALL FROM cur" -c "COMMIT" 2>&1)
    case $got in *"cannot run statements as role \"citus_free\""*) ;; *) fail "a cursor fetched under SET ROLE out of a binding: $got" ;; esac
    for shape in "COPY charges TO STDOUT" \
                 "ALTER TABLE charges ADD CONSTRAINT c_role CHECK (length(tenant_id) > 0)" \
                 "CREATE TEMP TABLE t_role (x int)"; do
        got=$(as_free -c "$shape" 2>&1)
        case $got in *"cannot run statements as role \"citus_free\""*) ;; *) fail "$shape under SET ROLE out of a binding: $got" ;; esac
    done
    q "$PC" -c "CREATE ROLE citus_owner NOLOGIN" \
        -c "CREATE FUNCTION public.citus_definer() RETURNS bigint LANGUAGE sql SECURITY DEFINER AS \$\$ SELECT count(*) FROM pg_class WHERE false \$\$" \
        -c "CREATE FUNCTION public.citus_definer_nologin() RETURNS bigint LANGUAGE sql SECURITY DEFINER AS \$\$ SELECT count(*) FROM pg_class WHERE false \$\$" \
        -c "ALTER FUNCTION public.citus_definer() OWNER TO citus_free" \
        -c "ALTER FUNCTION public.citus_definer_nologin() OWNER TO citus_owner" >/dev/null ||
        fail "SECURITY DEFINER functions"
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT public.citus_definer()" 2>&1)
    case $got in *"cannot run statements as role \"citus_free\""*) ;; *) fail "a SECURITY DEFINER function of an unbound login role: $got" ;; esac
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT public.citus_definer_nologin()" 2>&1)
    [ "$got" = 0 ] || fail "a SECURITY DEFINER function of a role that cannot log in: $got"
    # a call in a query over a distributed table is pushed into the shard
    # query, where Citus refuses nested distributed execution by default
    got=$(q "$PC" -c "INSERT INTO charges (tenant_id, idem_key, amount) VALUES ('acme', 'push1', 1)" \
               -c "SELECT (idem_reserve(tenant_id, 'bound', idem_key, '{}')).outcome FROM charges WHERE tenant_id = 'acme' AND idem_key = 'push1'" 2>&1)
    case $got in *"cannot execute a distributed query from a query on a shard"*) ;; *) fail "a call in a query over a distributed table: $got" ;; esac
    q "$PC" -c "DELETE FROM charges WHERE idem_key = 'push1'" >/dev/null
    # ...while SET ROLE to a role bound to the same tenant, and RESET ROLE,
    # work as before
    q "$PC" -c "CREATE ROLE citus_same LOGIN" -c "GRANT idempotency_app TO citus_same" \
        -c "GRANT citus_same TO citus_bound" -c "SELECT idem_bind_tenant('citus_same', 'acme')" >/dev/null ||
        fail "a second role bound to acme"
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SET ROLE citus_same" \
               -c "SELECT idem_reserve('acme', 'bound', 'same1', '{}')" 2>&1 | outcome)
    [ "$got" = created ] || fail "SET ROLE to a role bound to the same tenant: $got"
    got=$(as_free -c "RESET ROLE" -c "SELECT idem_reserve('acme', 'bound', 'reset1', '{}')" 2>&1 | outcome)
    [ "$got" = created ] || fail "RESET ROLE after SET ROLE out of the binding: $got"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.keys WHERE tenant_id = 'globex' AND scope = 'bound' AND idem_key IN ('sr1', 'st1', 'sp1', 'sp8', 'sf1', 'sv1', 'sv2', 'se1', 'sd1', 'sd2')")
    [ "$got" = 0 ] || fail "keys written by the refused calls: $got"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.outbox WHERE tenant_id = 'globex' AND topic = 'topic'")
    [ "$got" = 0 ] || fail "outbox rows written by the refused calls: $got"

    # a NULL tenant is refused on the coordinator (22004), from a role with
    # no grant too, and so is a call over a subquery of no table (0A000):
    # Citus's delegation of either crashes the backend, and the postmaster
    # would reset every session of the node
    q "$PC" -c "CREATE ROLE citus_nobody LOGIN" >/dev/null || fail "a role without grants"
    for shape in "SELECT idem_reserve(NULL, 'bound', 'n1', '{}')" \
                 "SELECT * FROM outbox_enqueue(NULL, 'topic', '{}')"; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "$shape" 2>&1)
        case $got in *"tenant must not be null"*) ;; *) fail "a NULL tenant, $shape: $got" ;; esac
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound \
               -c "PREPARE n(text) AS SELECT * FROM idem_reserve(\$1, 'bound', 'n2', '{}')" \
               -c "EXECUTE n(NULL)" 2>&1)
    case $got in *"tenant must not be null"*) ;; *) fail "a NULL tenant as a parameter: $got" ;; esac
    # ...and so is a NULL in the distribution argument of an application's
    # distributed function (a STRICT one is folded to NULL first)
    for shape in "SELECT charge_handler(NULL, 'k', '{}')" \
                 "SELECT * FROM charge_handler(NULL::text, 'k', '{}')"; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "$shape" 2>&1)
        case $got in *"distribution argument of charge_handler must not be null"*) ;; *) fail "a NULL distribution argument, $shape: $got" ;; esac
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound \
               -c "PREPARE h(text) AS SELECT charge_handler(\$1, 'k', '{}')" -c "EXECUTE h(NULL)" 2>&1)
    case $got in *"must not be null"*) ;; *) fail "a NULL distribution argument as a parameter: $got" ;; esac
    # (a default NULL too; a call Citus does not delegate, one without
    # force_delegation in a transaction block, is left to the function)
    q "$PC" -c "CREATE FUNCTION public.citus_def(k text, tenant text DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS \$\$ BEGIN RETURN coalesce(tenant, 'none'); END \$\$" \
        -c "SELECT create_distributed_function('citus_def(text, text)', 'tenant', colocate_with => 'idempotency.keys', force_delegation => true)" >/dev/null ||
        fail "a distributed function with a default tenant"
    got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "SELECT public.citus_def('k')" 2>&1)
    case $got in *"distribution argument of citus_def must not be null"*) ;; *) fail "a default NULL distribution argument: $got" ;; esac
    got=$(psql -X -q -A -t -p "$PC" -c "BEGIN" -c "SELECT charge_handler(NULL, 'k', '{}')" -c "ROLLBACK" 2>&1)
    case $got in *"distribution argument"*|*"terminated"*|*"closed the connection"*) fail "a NULL argument in a transaction block, not delegated: $got" ;; esac
    q "$PC" -c "CREATE FUNCTION public.citus_strict(tenant text) RETURNS text LANGUAGE plpgsql STRICT AS \$\$ BEGIN RETURN tenant; END \$\$" \
        -c "SELECT create_distributed_function('citus_strict(text)', 'tenant', colocate_with => 'idempotency.keys', force_delegation => true)" >/dev/null ||
        fail "a STRICT distributed function"
    got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "SELECT public.citus_strict(NULL)" -c "SELECT 'alive'" 2>&1)
    [ "$got" = "
alive" ] || fail "a STRICT distributed function with a NULL tenant: $got"
    got=$(psql -X -q -A -t -p "$PC" -U citus_nobody \
               -c "SELECT idem_reserve('globex', 'bound', 'c6', '{}') FROM (SELECT 1) x" 2>&1)
    case $got in *"over a subquery that reads no table"*) ;; *) fail "a call over a subquery of no table: $got" ;; esac
    # Citus decides on the planned statement: a SQL function inlined into a
    # call of ours is checked as planned (refused for another tenant, a
    # call for the role's own), and a subquery or WITH query pulled up into
    # one is refused (0A000), from a role with no grant too
    got=$(as_free \
               -c "$(wrapper sw1)" \
               -c "SELECT pg_temp.w('globex')" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "an inlined SQL function out of a binding: $got" ;; esac
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound \
               -c "$(wrapper sw2)" \
               -c "SELECT pg_temp.w('acme')" 2>/dev/null | outcome)
    [ "$got" = created ] || fail "an inlined SQL function for the role's own tenant: $got"
    for shape in "SELECT * FROM (SELECT * FROM idem_reserve('acme', 'bound', 'p1', '{}')) x" \
                 "SELECT r.* FROM (SELECT 'acme'::text t) s, LATERAL idem_reserve(s.t, 'bound', 'p2', '{}') r" \
                 "WITH c AS (SELECT 'acme'::text t) SELECT idem_reserve(c.t, 'bound', 'p3', '{}') FROM c" \
                 "WITH unused AS (SELECT 1 FROM pg_class) SELECT * FROM (SELECT * FROM idem_reserve('acme', 'bound', 'p4', '{}')) x"; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "$shape" 2>&1)
        case $got in *"subquery"*) ;; *) fail "a pulled-up subquery, $shape: $got" ;; esac
    done
    # ...and after clauses the planner folds away, a view, and a SETOF SQL
    # function the planner inlines into a subquery
    for shape in "SELECT pg_temp.w('globex') WHERE true OR EXISTS (SELECT 1 FROM pg_class)" \
                 "WITH u AS (SELECT 1 FROM pg_class) SELECT pg_temp.w('globex')"; do
        got=$(as_free \
                   -c "$(wrapper sw3)" \
                   -c "$shape" 2>&1)
        case $got in *"is bound to tenant \"acme\""*|*"subquery"*) ;; *) fail "a folded wrapper out of a binding, $shape: $got" ;; esac
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_nobody \
               -c "CREATE TEMP VIEW v AS SELECT * FROM idem_lookup('acme', 'bound', 'alive')" \
               -c "SELECT * FROM v" 2>&1)
    case $got in *"subquery"*) ;; *) fail "a view over a call: $got" ;; esac
    # a STABLE SETOF SQL function over a call is inlined into a subquery
    # (through another such function, or in a WITH query, too)
    local ws="CREATE FUNCTION pg_temp.ws(t text) RETURNS SETOF idempotency.reservation LANGUAGE sql STABLE AS \$\$ SELECT * FROM idem_reserve(t, 'bound', 'ss1', '{}') \$\$"
    local ws2="CREATE FUNCTION pg_temp.ws2(t text) RETURNS SETOF idempotency.reservation LANGUAGE sql STABLE AS \$\$ SELECT * FROM pg_temp.ws(t) \$\$"
    for shape in "SELECT * FROM pg_temp.ws('acme')" \
                 "SELECT outcome FROM pg_temp.ws2('acme')" \
                 "WITH c AS (SELECT * FROM pg_temp.ws('acme')) SELECT outcome FROM c"; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "$ws" -c "$ws2" -c "$shape" 2>&1)
        case $got in *"SETOF SQL function"*) ;; *) fail "a SETOF SQL function over a call, $shape: $got" ;; esac
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_nobody \
               -c "SELECT idem_reserve(s.t, 'bound', 'p5', '{}') FROM (SELECT t FROM (SELECT 'acme'::text t) i) s WHERE true OR EXISTS (SELECT 1 FROM pg_class)" 2>&1)
    case $got in *"subquery"*) ;; *) fail "a pulled-up subquery behind a folded WHERE: $got" ;; esac
    # ...and when a table is read only in a sub-select of an expression or
    # in a WITH query: neither keeps the planner from pulling the call up
    for shape in "WITH a AS (SELECT 1 FROM pg_class), b AS (SELECT * FROM a) SELECT * FROM (SELECT * FROM idem_lookup('acme', 'bound', 'x')) x" \
                 "SELECT x.status, (SELECT 1 FROM pg_class LIMIT 1) FROM (SELECT * FROM idem_lookup('acme', 'bound', 'x')) x" \
                 "SELECT r.* FROM (SELECT 'globex'::text t) s, LATERAL idem_reserve(s.t, 'bound', 'p6', '{}') r LIMIT (SELECT 1 FROM pg_class LIMIT 1)" \
                 "SELECT idem_reserve(s.t, 'bound', 'p7', '{}') FROM (SELECT t FROM (SELECT 'globex'::text t) i) s LIMIT (SELECT 1 FROM pg_class LIMIT 1)" \
                 "SELECT r.* FROM (SELECT 'acme'::text t) s, LATERAL idem_reserve(s.t, 'bound', 'p8', '{}') r ORDER BY (SELECT 1 FROM pg_class LIMIT 1)" \
                 "SELECT idem_reserve(l, 'bound', 'p9', '{}') FROM (SELECT 'ACME'::text t) s, LATERAL lower(s.t) l"; do
        got=$(psql -X -q -A -t -p "$PC" -U citus_nobody -c "$shape" 2>&1)
        case $got in *"subquery"*) ;; *) fail "a pulled-up call, a table in a sub-select or WITH query only, $shape: $got" ;; esac
    done
    # a batch of acknowledgements over unnest(...) or a VALUES list of
    # several rows is not delegated (the FROM item stays), and runs
    local acks
    for _ in 1 2 3 4; do
        q "$PC" -c "SELECT outbox_enqueue('acme', 'batch.ack', '{}')" >/dev/null || fail "an enqueue for the acks"
    done
    # (claimed on the tenant's worker, which holds its rows)
    acks=$(q "$port" -c "SELECT id || ' ' || lease_token FROM outbox_claim('w', 4, '5 minutes', ARRAY['batch.ack']) ORDER BY id")
    got=$(echo "$acks" | awk 'NR <= 2 { i = i s $1; t = t s $2; s = "," }
              END { printf "SELECT outbox_ack(%cacme%c, a.id, a.tok) FROM unnest(%c{%s}%c::bigint[], %c{%s}%c::uuid[]) a(id, tok)", 39, 39, 39, i, 39, 39, t, 39 }' |
          psql -X -q -A -t -p "$PC" -f - 2>&1)
    case $got in *ERROR*) fail "a batch of acks over unnest: $got" ;; esac
    got=$(echo "$acks" | awk 'NR > 2 { v = v s sprintf("(%s, %c%s%c::uuid)", $1, 39, $2, 39); s = ", " }
              END { printf "SELECT outbox_ack(%cacme%c, a.id, a.tok) FROM (VALUES %s) a(id, tok)", 39, 39, v }' |
          psql -X -q -A -t -p "$PC" -f - 2>&1)
    case $got in *ERROR*) fail "a batch of acks over a VALUES list: $got" ;; esac
    # ...and a call over a function that stays (now()), or in FROM with a
    # WHERE, is not delegated either: it runs (here: no such row)
    for shape in "SELECT outbox_ack('acme', 0, '00000000-0000-4000-8000-000000000000') FROM now() t" \
                 "SELECT * FROM outbox_ack('acme', 0, '00000000-0000-4000-8000-000000000000') WHERE EXISTS (SELECT 1 FROM pg_class)"; do
        got=$(psql -X -q -A -t -p "$PC" -c "$shape" 2>&1)
        case $got in *subquery*|*terminated*|*closed*) fail "a call that Citus does not delegate, $shape: $got" ;; esac
    done
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.outbox WHERE tenant_id = 'acme' AND topic = 'batch.ack' AND status = 'done'")
    [ "$got" = 4 ] || fail "rows acknowledged over unnest and VALUES: $got of 4"
    # ordinary statements of one's own SQL functions over tables are left
    # alone (no planning of a copy: Citus's hooks need their own planner)
    got=$(q "$PC" -c "CREATE FUNCTION public.citus_rels(n name) RETURNS SETOF pg_class LANGUAGE sql STABLE AS \$\$ SELECT * FROM pg_class WHERE relname = n \$\$" \
               -c "SELECT count(*) FROM public.citus_rels('pg_class')" 2>&1)
    [ "$got" = 1 ] || fail "an inlined SETOF SQL function over a table: $got"
    # a wrapper reached through an operator, or under a LIMIT that reads a
    # table (a statement that reads a table is folded, not planned, here)
    got=$(as_free \
               -c "CREATE FUNCTION pg_temp.opf(t text, k text) RETURNS idempotency.reservation LANGUAGE sql AS \$\$ SELECT idem_reserve(t, 'bound', k, '{}') \$\$" \
               -c "CREATE OPERATOR pg_temp.#### (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_temp.opf)" \
               -c "SELECT 'globex' OPERATOR(pg_temp.####) 'op1'" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "an operator over a wrapper out of a binding: $got" ;; esac
    got=$(as_free \
               -c "$(wrapper sw4)" \
               -c "SELECT pg_temp.w('globex') LIMIT (SELECT 1 FROM pg_class LIMIT 1)" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "a wrapper under a LIMIT that reads a table: $got" ;; esac
    # an application's own SQL function over a table is left alone
    got=$(q "$PC" -c "CREATE FUNCTION public.citus_upper(t text) RETURNS text LANGUAGE sql IMMUTABLE AS \$\$ SELECT upper(t) \$\$" \
               -c "SELECT public.citus_upper(relname) FROM pg_class WHERE relname = 'pg_class'" 2>&1)
    [ "$got" = PG_CLASS ] || fail "a SQL function of one's own over a table: $got"
    got=$(q "$PC" -c "WITH c AS (SELECT relname FROM pg_class WHERE relname = 'pg_class') SELECT public.citus_upper(relname) FROM c" 2>&1)
    [ "$got" = PG_CLASS ] || fail "a SQL function of one's own over a WITH query of a table: $got"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.keys WHERE scope = 'bound' AND idem_key IN ('sw1', 'sw3', 'sw4', 'op1', 'p1', 'p2', 'p3', 'p4', 'ss1')")
    [ "$got" = 0 ] || fail "keys written by the refused planned shapes: $got"
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT idem_reserve('acme', 'bound', 'alive', '{}')" | outcome)
    [ "$got" = created ] || fail "the coordinator after the refused calls: $got"
    ! grep -q "terminated by signal" "$base/node-$PC.log" || fail "a backend of the coordinator crashed"

    # unbinding goes by the role's name on every node: a role's OID differs
    # from node to node (roles made on one worker only shift them here)
    local wp
    for wp in $PW1 $PW2; do
        q "$wp" -c "SET citus.enable_ddl_propagation = off" -c "CREATE ROLE citus_shift_$wp" >/dev/null ||
            fail "a role on worker $wp only"
    done
    q "$PC" -c "CREATE ROLE citus_moved LOGIN" -c "GRANT idempotency_app TO citus_moved" \
        -c "SELECT idem_bind_tenant('citus_moved', 'acme')" -c "SELECT idem_unbind_tenant('citus_moved')" \
        >/dev/null || fail "binding and unbinding a role"
    for wp in $PW1 $PW2; do
        got=$(q "$wp" -c "SELECT count(*) FROM idempotency.tenant_bindings WHERE role::text = 'citus_moved'")
        [ "$got" = 0 ] || fail "the unbound role is still bound on worker $wp"
    done
    got=$(psql -X -q -A -t -p "$PC" -U citus_moved -c "SELECT idem_reserve('globex', 'bound', 'm1', '{}')" 2>&1 | outcome)
    [ "$got" = created ] || fail "the unbound role for another tenant: $got"
    got=$(psql -X -q -A -t -p "$PC" -U citus_bound -c "SELECT idem_reserve('globex', 'bound', 'm2', '{}')" 2>&1)
    case $got in *"is bound to tenant \"acme\""*) ;; *) fail "the role still bound, after another's unbinding: $got" ;; esac

    # a quota of live keys holds on the tenant's worker: its count reads the
    # tenant's shard there, and the admissions are that node's shared memory
    q "$PC" -c "SELECT idem_configure_scope('quota', '{\"max_live_keys\": 2}')" >/dev/null ||
        fail "configuring a quota"
    local answers=
    for k in q1 q2 q3; do
        answers="$answers $(q "$PC" -c "SELECT idem_reserve('acme', 'quota', '$k', '{}')" | outcome)"
    done
    [ "$answers" = " created created rate_limited" ] || fail "quota of 2 live keys: [$answers]"
    # a count a second later still sees the two keys in the shard
    sleep 1.1
    got=$(q "$PC" -c "SELECT idem_reserve('acme', 'quota', 'q4', '{}')" | outcome)
    [ "$got" = rate_limited ] || fail "quota of 2 live keys after a recount: $got"
    got=$(q "$port" -c "SELECT count(*) FROM idempotency.keys_$shard WHERE tenant_id = 'acme' AND scope = 'quota'")
    [ "$got" = 2 ] || fail "keys of the quota's scope in idempotency.keys_$shard on $port: $got"

    # on a node without the tenant's shard the key functions refuse to run
    # (here the coordinator: Citus does not delegate a call nested in a block)
    got=$(q "$PC" -c "DO \$\$ BEGIN PERFORM idem_reserve('acme', 'charge', 'k3', '{}'); END \$\$" 2>&1)
    case $got in *"is not on this node"*) ;; *) fail "undelegated call on the coordinator: $got" ;; esac
    # and so does outbox_enqueue, whose id comes from the shard's node
    got=$(q "$PC" -c "DO \$\$ BEGIN PERFORM outbox_enqueue('acme', 'evt', '{}'); END \$\$" 2>&1)
    case $got in *"is not on this node"*) ;; *) fail "undelegated outbox_enqueue on the coordinator: $got" ;; esac
}

suite_payments() {
    local port ports got
    port=$(shard_port globex)
    echo "  tenant globex lives on $port"
    ports=$(routed_ports <<'SQL'
BEGIN;
SELECT idem_reserve('globex', 'charge', 'p1', '{"amount": 500}');
INSERT INTO charges (tenant_id, idem_key, amount) VALUES ('globex', 'p1', 500);
SELECT outbox_enqueue('globex', 'charge.created', '{"amount": 500}', 'p1', 'charge');
SELECT idem_complete('globex', 'charge', 'p1', 201, '{"id": "ch_p1"}');
COMMIT;
SQL
) || { fail "payment: $(cat "$base/routed.log")"; return; }
    [ "$ports" = "$port" ] || fail "the payment's transaction ran on [$ports], not on $port alone"
    if grep -q 'PREPARE TRANSACTION' "$base/routed.log"; then
        fail "the payment's transaction used two-phase commit"
    fi
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM charges WHERE tenant_id = 'globex' AND idem_key = 'p1')
                      || ' ' || (SELECT count(*) FROM idempotency.outbox WHERE tenant_id = 'globex' AND idem_key = 'p1')
                      || ' ' || (SELECT status FROM idempotency.keys WHERE tenant_id = 'globex' AND idem_key = 'p1')")
    [ "$got" = "1 1 succeeded" ] || fail "charge, outbox row, key: $got"
    # the insert into the colocated table is a single-shard statement on that worker
    got=$(q "$PC" -c "EXPLAIN (COSTS OFF) INSERT INTO charges (tenant_id, idem_key, amount) VALUES ('globex', 'x', 1)")
    case $got in *"Task Count: 1"*"port=$port"*) ;; *) fail "EXPLAIN of the charge: $got" ;; esac
    # the retry replays; a rolled back attempt leaves nothing
    got=$(q "$PC" -c "SELECT idem_reserve('globex', 'charge', 'p1', '{\"amount\": 500}')" | outcome)
    [ "$got" = replay ] || fail "retry of the payment: $got"
    q "$PC" >/dev/null <<'SQL' || fail "rolled back payment"
BEGIN;
SELECT idem_reserve('globex', 'charge', 'p2', '{"amount": 7}');
INSERT INTO charges (tenant_id, idem_key, amount) VALUES ('globex', 'p2', 7);
SELECT outbox_enqueue('globex', 'charge.created', '{"amount": 7}', 'p2', 'charge');
ROLLBACK;
SQL
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM charges WHERE idem_key = 'p2')
                      + (SELECT count(*) FROM idempotency.outbox WHERE idem_key = 'p2')
                      + (SELECT count(*) FROM idempotency.keys WHERE idem_key = 'p2')")
    [ "$got" = 0 ] || fail "a rolled back payment left $got rows"
    got=$(q "$PC" -c "SELECT idem_reserve('globex', 'charge', 'p2', '{\"amount\": 7}')")
    [ "$(echo "$got" | outcome)" = created ] || fail "retry of the rolled back payment: $got"
    q "$PC" -c "SELECT idem_release('globex', 'charge', 'p2', '$(echo "$got" | token)')" >/dev/null ||
        fail "a release from another transaction"
}

suite_storm() {
    local got log
    # 8 sessions, 1,200 requests on 64 tenants x 20 keys: many duplicates
    # arrive while their first attempt is running
    cat >"$base/storm.sql" <<'EOF'
\set t random(1, 64)
\set k random(1, 20)
SELECT idem_execute('s:t', 'storm', 'k:k', '{"amount": 1}', 'charge_handler');
EOF
    log=$base/storm.log
    if ! pgbench -n -p "$PC" -c 8 -j 2 -t 150 -f "$base/storm.sql" >"$log" 2>&1; then
        fail "pgbench: $(tail -n 5 "$log")"
    fi
    grep -E '^(number of transactions actually processed|tps)' "$log" | sed 's/^/  /'
    got=$(q "$PC" -c "SELECT count(*) FROM (SELECT tenant_id, idem_key FROM charges
                       WHERE tenant_id LIKE 's%' GROUP BY 1, 2 HAVING count(*) > 1) d")
    [ "$got" = 0 ] || fail "$got keys were executed more than once"
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM idempotency.keys WHERE scope = 'storm' AND status = 'succeeded')
                      || ' ' || (SELECT count(*) FROM charges WHERE tenant_id LIKE 's%')
                      || ' ' || (SELECT count(*) FROM idempotency.keys WHERE scope = 'storm')")
    echo "  succeeded keys, charges, keys: $got"
    set -- $got
    [ "$1" = "$2" ] && [ "$1" = "$3" ] && [ "$1" -gt 0 ] || fail "keys and charges differ: $got"
    # the requests ran on both workers, each on its tenant's worker
    got=$(q "$PC" -c "SELECT count(DISTINCT node) FROM charges WHERE tenant_id LIKE 's%'")
    [ "$got" = 2 ] || fail "the handler ran on $got nodes"
    got=$(q "$PC" -c "SELECT count(*) FROM charges c
                       WHERE tenant_id LIKE 's%' AND node <> (
                             SELECT nodeport FROM pg_dist_shard_placement
                              WHERE shardid = get_shard_id_for_distribution_column('idempotency.keys', c.tenant_id))")
    [ "$got" = 0 ] || fail "$got charges ran on a node other than their tenant's"
    for port in $PW1 $PW2; do
        echo "  worker $port: $(q "$port" -c "SELECT 'created ' || coalesce(sum(created), 0) || ', replayed ' || coalesce(sum(replayed), 0) || ', in_progress ' || coalesce(sum(in_progress), 0) FROM idem_stats() WHERE scope = 'storm'")"
    done
}

# drain PORT NAME OUT: claim and acknowledge on one node until nothing is left
drain() {
    local port=$1 name=$2 out=$3 rows
    : >"$out"
    while :; do
        rows=$(q "$port" -c "SELECT tenant_id || ' ' || id || ' ' || lease_token
                               FROM outbox_claim('$name', 7, '5 minutes', ARRAY['evt'])") || return 1
        [ -n "$rows" ] || break
        echo "$rows" >>"$out"
        echo "$rows" | awk '{ printf "SELECT outbox_ack(%c%s%c, %s, %c%s%c);\n", 39, $1, 39, $2, 39, $3, 39 }' |
            q "$port" >/dev/null || return 1
    done
}

suite_outbox() {
    local got n=360 i
    for i in $(seq 1 $n); do
        echo "SELECT outbox_enqueue('o$((i % 60))', 'evt', '{\"n\": $i}');"
    done | q "$PC" >/dev/null || { fail "enqueue"; return; }
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 'evt' AND status = 'pending'")
    [ "$got" = "$n" ] || fail "$got rows pending, not $n"
    # the coordinator holds no shard: nothing to claim there
    got=$(q "$PC" -c "SELECT count(*) FROM outbox_claim('coordinator', 10)")
    [ "$got" = 0 ] || fail "claimed $got rows on the coordinator"
    # two outbox workers per node, four at once
    drain "$PW1" w1a "$base/w1a" & local p1=$!
    drain "$PW1" w1b "$base/w1b" & local p2=$!
    drain "$PW2" w2a "$base/w2a" & local p3=$!
    drain "$PW2" w2b "$base/w2b" & local p4=$!
    wait $p1 || fail "outbox worker w1a"
    wait $p2 || fail "outbox worker w1b"
    wait $p3 || fail "outbox worker w2a"
    wait $p4 || fail "outbox worker w2b"
    echo "  delivered: $(wc -l <"$base/w1a") + $(wc -l <"$base/w1b") on $PW1, $(wc -l <"$base/w2a") + $(wc -l <"$base/w2b") on $PW2"
    got=$(cat "$base/w1a" "$base/w1b" "$base/w2a" "$base/w2b" | awk '{print $1, $2}' | sort | uniq -d | wc -l)
    [ "$got" = 0 ] || fail "$got rows delivered twice"
    got=$(cat "$base/w1a" "$base/w1b" "$base/w2a" "$base/w2b" | awk '{print $1, $2}' | sort -u | wc -l)
    [ "$got" = "$n" ] || fail "$got rows delivered, not $n"
    [ "$(cat "$base/w1a" "$base/w1b" | wc -l)" -gt 0 ] && [ "$(cat "$base/w2a" "$base/w2b" | wc -l)" -gt 0 ] ||
        fail "one worker node delivered nothing"
    got=$(q "$PC" -c "SELECT count(*) FILTER (WHERE status = 'done') || ' ' || count(*)
                        FROM idempotency.outbox WHERE topic = 'evt'")
    [ "$got" = "$n $n" ] || fail "done, all: $got"

    # batch acknowledgement, delegated to the tenant's worker: three rows
    # acknowledged and three reported failed, each in one statement
    for i in 1 2 3 4 5 6; do
        echo "SELECT outbox_enqueue('batch', 'bt', '{\"n\": $i}');"
    done | q "$PC" >/dev/null || { fail "enqueue for a batch"; return; }
    local claimed="" ids toks wp
    for wp in $PW1 $PW2; do
        claimed="$claimed$(q "$wp" -c "SELECT string_agg(id::text, ',' ORDER BY id) || ' '
                                                || string_agg(lease_token::text, ',' ORDER BY id)
                                           FROM outbox_claim('bw', 6, '5 minutes', ARRAY['bt'], 'batch')")"
    done
    read -r ids toks <<<"$claimed"
    local ida=${ids%,*,*,*} idn=${ids#*,*,*,} toka=${toks%,*,*,*} tokn=${toks#*,*,*,}
    got=$(q "$PC" -c "SELECT count(*) FROM outbox_ack_many('batch', '{$ida}'::bigint[], '{$toka}'::uuid[])" 2>&1)
    [ "$got" = 3 ] || fail "outbox_ack_many through the coordinator: $got (ids $ids)"
    got=$(q "$PC" -c "SELECT string_agg(status::text, ',') FROM outbox_nack_many('batch', '{$idn}'::bigint[], '{$tokn}'::uuid[], 'HTTP 503', '1 hour')" 2>&1)
    [ "$got" = "pending,pending,pending" ] || fail "outbox_nack_many through the coordinator: $got"
    got=$(q "$PC" -c "SELECT string_agg(status || ':' || coalesce(last_error, '-'), ',' ORDER BY id)
                        FROM idempotency.outbox WHERE tenant_id = 'batch'")
    [ "$got" = "done:-,done:-,done:-,pending:HTTP 503,pending:HTTP 503,pending:HTTP 503" ] ||
        fail "after the batches: $got"

    # ordered delivery on the shards: the claims of both nodes hand out one
    # row of a key at a time (outbox_ordering_head probes the shard the
    # row is in), in enqueue order
    local seen="" rows port
    for i in 1 2 3; do
        echo "SELECT outbox_enqueue('ord', 'ordevt', '{\"n\": $i}', ordering_key => 'A');"
    done | q "$PC" >/dev/null || { fail "ordered enqueue"; return; }
    for i in 1 2 3; do
        rows=""
        for port in $PW1 $PW2; do
            got=$(q "$port" -c "SELECT tenant_id || ' ' || id || ' ' || lease_token || ' ' || (payload->>'n')
                                  FROM outbox_claim('ord-$port', 10, '5 minutes', ARRAY['ordevt'])") ||
                { fail "ordered claim on $port"; return; }
            [ -z "$got" ] || rows="$rows$got"$'\n'
        done
        [ "$(printf '%s' "$rows" | grep -c .)" = 1 ] || { fail "ordered round $i claimed: '$rows'"; return; }
        seen="$seen$(echo "$rows" | awk 'NF { print $4 }')"
        echo "$rows" | awk 'NF { printf "SELECT outbox_ack(%c%s%c, %s, %c%s%c);\n", 39, $1, 39, $2, 39, $3, 39 }' |
            q "$PC" >/dev/null || { fail "ordered ack $i"; return; }
    done
    [ "$seen" = "123" ] || fail "ordered delivery gave $seen, not 123"
    echo "  ordered: one row of key A at a time, in order ($seen)"

    # one backend that runs the key functions, then claims and acknowledges:
    # the extension's caches share one of the 10 relcache callback slots a
    # backend has (Citus takes five; one slot each ran out, FATAL).  On the
    # tenant's worker, then through one coordinator session, whose
    # connection to the worker Citus keeps
    local mp
    mp=$(shard_port mix)
    got=$(q "$mp" 2>&1 <<'SQL'
BEGIN;
SELECT outcome FROM idem_reserve('mix', 'charge', 'm-1', '{"a": 1}');
SELECT idem_complete('mix', 'charge', 'm-1', 201, '{}');
COMMIT;
SELECT outbox_enqueue('mix', 'mixevt', '{}') > 0;
SELECT count(outbox_ack('mix', id, lease_token))
  FROM outbox_claim('mixw', 1, '1 minute', ARRAY['mixevt'], 'mix');
SQL
)
    [ "$got" = "created
succeeded
t
1" ] || fail "keys, then claim and ack in one session on $mp: $got"
    q "$PC" -c "SELECT outbox_enqueue('mix', 'mixevt', '{}')" >/dev/null || fail "enqueue for mix"
    got=$(q "$mp" -c "SELECT id || ' ' || lease_token FROM outbox_claim('mixw', 1, '1 minute', ARRAY['mixevt'], 'mix')" 2>&1)
    got=$(q "$PC" 2>&1 <<SQL
BEGIN;
SELECT outcome FROM idem_reserve('mix', 'charge', 'm-2', '{"a": 2}');
SELECT idem_complete('mix', 'charge', 'm-2', 201, '{}');
COMMIT;
SELECT 'acked' FROM outbox_ack('mix', ${got% *}, '${got#* }');
SQL
)
    [ "$got" = "created
succeeded
acked" ] || fail "keys, then an ack through one coordinator session: $got"
    got=$(q "$PC" -c "SELECT string_agg(status::text, ',') FROM idempotency.outbox WHERE tenant_id = 'mix'")
    [ "$got" = "done,done" ] || fail "mix's outbox rows: $got"
    echo "  keys, claims and acks in one session: on the worker and through the coordinator"

    # the limits README states: Citus refuses PREPARE TRANSACTION after a
    # delegated call, and a trigger's enqueue on a write sent through the
    # coordinator (nothing is written)
    got=$(q "$PC" 2>&1 <<'SQL'
BEGIN;
SELECT outcome FROM idem_reserve('mix', 'charge', 'm-prep', '{}');
PREPARE TRANSACTION 'idem_citus_prep';
SQL
)
    case $got in
        *"cannot use 2PC in transactions involving multiple servers"*) ;;
        *) fail "PREPARE TRANSACTION after a delegated call: $got" ;;
    esac
    got=$(q "$PC" 2>&1 <<'SQL'
CREATE TABLE trig_orders (tenant_id text COLLATE "C" NOT NULL, id int NOT NULL);
SELECT create_distributed_table('trig_orders', 'tenant_id', colocate_with => 'idempotency.keys');
CREATE FUNCTION trig_orders_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM outbox_enqueue(new.tenant_id, 'trig', '{}'); RETURN new; END $$;
SET citus.enable_unsafe_triggers = on;
CREATE TRIGGER trig_orders_out AFTER INSERT ON trig_orders FOR EACH ROW EXECUTE FUNCTION trig_orders_out();
INSERT INTO trig_orders VALUES ('mix', 1);
SQL
)
    case $got in
        *"forced function pushdown"*) ;;
        *) fail "a trigger's enqueue through the coordinator: $got" ;;
    esac
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM trig_orders) + (SELECT count(*) FROM idempotency.outbox WHERE topic = 'trig')
                        + (SELECT count(*) FROM idempotency.keys WHERE idem_key = 'm-prep')")
    [ "$got" = 0 ] || fail "rows left by the refused PREPARE and trigger: $got"
    q "$PC" -c "DROP TABLE trig_orders; DROP FUNCTION trig_orders_out()" >/dev/null
}

suite_maintenance() {
    local got n1 n2 i
    # a worker session caches the default policy of scope "short" ...
    got=$(q "$PC" -c "SELECT idem_reserve('m0', 'short', 'first', '{}')")
    [ "$(echo "$got" | outcome)" = created ] || fail "first key of scope short: $got"
    q "$PC" -c "SELECT idem_complete('m0', 'short', 'first', 200, '{}', lock_token => '$(echo "$got" | token)')" >/dev/null ||
        fail "complete the first key of scope short"
    # ... and the scope's new policy reaches it: scopes is a reference table
    # whose trigger fires on every node
    q "$PC" -c "SELECT idem_configure_scope('short', '{\"ttl\": \"1 second\"}')" >/dev/null ||
        fail "idem_configure_scope"
    got=$(q "$PW1" -c "SELECT ttl FROM idempotency.scopes WHERE scope = 'short'")
    [ "$got" = "00:00:01" ] || fail "scope on worker $PW1: '$got'"
    for i in $(seq 1 40); do
        echo "SELECT idem_execute('m$i', 'short', 'k', '{\"amount\": 1}', 'charge_handler');"
    done | q "$PC" >/dev/null || fail "keys of scope short"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.keys
                       WHERE scope = 'short' AND tenant_id <> 'm0'
                         AND expires_at > now() + interval '1 minute'")
    [ "$got" = 0 ] || fail "$got keys did not get the scope's new ttl"

    # sweep, reclaim, reap and purge run on each node holding shards
    # (pg_cron on each node, or calls per node)
    for i in $(seq 1 12); do echo "SELECT outbox_enqueue('l$i', 'lease', '{}');"; done | q "$PC" >/dev/null
    for port in $PW1 $PW2; do
        q "$port" -c "SELECT count(*) FROM outbox_claim('lost-$port', 100, '1 second', ARRAY['lease'])" >/dev/null
    done
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 'lease' AND status = 'leased'")
    [ "$got" = 12 ] || fail "$got of 12 rows leased"
    sleep 2
    n1=$(q "$PW1" -c "SELECT idem_reap(1000)")
    n2=$(q "$PW2" -c "SELECT idem_reap(1000)")
    echo "  reaped $n1 on $PW1, $n2 on $PW2"
    [ "${n1:-0}" -gt 0 ] && [ "${n2:-0}" -gt 0 ] || fail "reaped $n1 and $n2: not on both workers"
    [ $((n1 + n2)) = 40 ] || fail "reaped $((n1 + n2)) keys, not 40"
    n1=$(q "$PW1" -c "SELECT idem_reclaim_leases()")
    n2=$(q "$PW2" -c "SELECT idem_reclaim_leases()")
    echo "  reclaimed $n1 leases on $PW1, $n2 on $PW2"
    [ $((n1 + n2)) = 12 ] || fail "reclaimed $((n1 + n2)) leases, not 12"
    for port in $PW1 $PW2; do
        q "$port" -c "CALL idem_maintain('5 seconds', 100, '0')" || fail "idem_maintain on $port"
    done
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.keys WHERE scope = 'short'")
    [ "$got" = 1 ] || fail "$got keys of scope short left, not 1"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.outbox WHERE topic = 'lease' AND status = 'pending'")
    [ "$got" = 12 ] || fail "$got of 12 reclaimed rows pending"
    suite_maintenance_sweep
    # the coordinator holds no shard: maintenance there does nothing
    got=$(q "$PC" -c "SELECT idem_reap(1000) + idem_sweep() + idem_reclaim_leases() + idem_purge_outbox(1000)")
    [ "$got" = 0 ] || fail "maintenance on the coordinator: $got"
    # health is one cluster-wide query from the coordinator
    got=$(q "$PC" -c "SELECT outbox_pending FROM idempotency.health") || fail "health on the coordinator"
    [ "${got:-0}" -ge 12 ] || fail "health: outbox_pending $got"
    # ...also for a member of idempotency_admin, as README says to read it
    q "$PC" -c "CREATE ROLE citus_ops LOGIN IN ROLE idempotency_admin" >/dev/null
    got=$(psql -X -q -A -t -p "$PC" -U citus_ops -d postgres -c "SELECT outbox_pending FROM idempotency.health" 2>&1)
    [ "${got:-0}" -ge 12 ] 2>/dev/null || fail "health as a member of idempotency_admin: $got"
    q "$PC" -c "DROP ROLE citus_ops" >/dev/null
}

# The scheduled sweep on a worker: one run reads at most pages_per_run
# pages of the node's shards of idempotency.keys (a slice may end one
# shard and start the next), and the runs go round all of them, flagging
# every stale key the node holds.  (Citus hides the shards from pg_class
# unless citus.override_table_visibility is off.)
suite_maintenance_sweep() {
    local got pages stale runs fetched flagged
    local shards="pg_catalog.pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
                  AND c.relkind = 'r' AND c.relname ~ '^keys_[0-9]+\$'"
    q "$PC" -c "INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                                              locked_at, completed_at, expires_at,
                                              response_code, response_body)
                SELECT 'sw' || (g % 64), 'sweep', 'done-' || g, sha256(g::text::bytea), 'succeeded',
                       now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day',
                       201, '{\"padding\": \"0123456789012345678901234567890123456789\"}'
                  FROM generate_series(1, 20000) g" >/dev/null || { fail "sweep: finished keys"; return; }
    q "$PC" -c "INSERT INTO idempotency.keys (tenant_id, scope, idem_key, fingerprint, status,
                                              locked_at, expires_at)
                SELECT 'sw' || g, 'sweep', 'stale', sha256('s'::bytea), 'processing',
                       now() - interval '1 hour', now() + interval '1 day'
                  FROM generate_series(0, 63) g" >/dev/null || { fail "sweep: stale keys"; return; }
    stale=$(q "$PC" -c "SELECT count(*) FROM generate_series(0, 63) g
                         JOIN pg_catalog.pg_dist_shard_placement p
                           ON p.shardid = get_shard_id_for_distribution_column('idempotency.keys', 'sw' || g)
                        WHERE p.nodeport = $PW1")
    pages=$(q "$PW1" -c "SET citus.override_table_visibility = off" \
              -c "SELECT (sum(pg_catalog.pg_relation_size(c.oid)) / current_setting('block_size')::int)::bigint
                           FROM $shards")
    echo "  sweep on $PW1: $pages pages in its shards of keys, $stale stale keys"
    [ "${pages:-0}" -gt 40 ] && [ "${stale:-0}" -gt 0 ] || { fail "sweep: $pages pages, $stale stale keys on $PW1"; return; }
    q "$PW1" -c "UPDATE idempotency.sweep_state SET pages_per_run = 8, next_page = 0" >/dev/null ||
        fail "sweep: pages_per_run"
    # a run reads its 8 pages, and each key it flags once more (a few
    # fetches of that key's page to lock and update it)
    for _ in 1 2; do
        set -- $(q "$PW1" -F ' ' <<SQL
SET citus.override_table_visibility = off;
SELECT pg_catalog.pg_stat_force_next_flush() \\g /dev/null
BEGIN;
SELECT idem_sweep() AS flagged \\gset
SELECT sum(pg_catalog.pg_stat_get_xact_blocks_fetched(c.oid))::bigint, :flagged FROM $shards;
COMMIT;
SQL
        )
        fetched=${1:-999999} flagged=${2:-0}
        echo "  one scheduled sweep on $PW1 read $fetched pages of $pages, flagged $flagged keys"
        [ "$fetched" -le $((12 + 4 * flagged)) ] ||
            fail "one scheduled sweep read $fetched pages (pages_per_run 8) to flag $flagged keys"
    done
    got=$(q "$PW1" -c "SELECT next_page FROM idempotency.sweep_state")
    [ "$got" = 16 ] || fail "sweep cursor after two runs: $got, not 16"
    runs=$((pages / 8 + 4))
    q "$PW1" -c "DO \$\$ BEGIN FOR i IN 1 .. $runs LOOP PERFORM idem_sweep(); END LOOP; END \$\$" ||
        fail "sweep: $runs runs"
    got=$(q "$PC" -c "SELECT count(*) FROM idempotency.keys
                       WHERE scope = 'sweep' AND idem_key = 'stale' AND needs_reconciliation")
    [ "$got" = "$stale" ] || fail "the runs on $PW1 flagged $got stale keys, not $stale"
    got=$(q "$PW1" -c "SELECT next_page < $pages FROM idempotency.sweep_state")
    [ "$got" = t ] || fail "sweep cursor beyond the node's pages"
    q "$PW1" -c "UPDATE idempotency.sweep_state SET pages_per_run = 16384, next_page = 0" >/dev/null
    q "$PC" -c "DELETE FROM idempotency.keys WHERE scope = 'sweep'" >/dev/null
}

# A tenant's shard group moves to the other worker
# (citus_move_shard_placement, block_writes) while sessions are open on
# the coordinator and on the worker it leaves: the key functions follow
# it, a session that had cached the old placement included; the outbox
# row moves with it and is claimed on the new node only; the node it left
# answers for it no more.  Then the tenant gets a shard of its own
# (isolate_tenant_to_new_shard), under an open session again.
suite_move() {
    local t=mover shard from to tok got
    from=$(shard_port $t)
    if [ "$from" = "$PW1" ]; then to=$PW2; else to=$PW1; fi
    shard=$(q "$PC" -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', '$t')")
    tok=$(q "$PC" -c "SELECT idem_reserve('$t', 'move', 'k1', '{\"amount\": 1}')" | token)
    q "$PC" -c "SELECT idem_complete('$t', 'move', 'k1', 201, '{\"ok\": true}', lock_token => '$tok')" >/dev/null ||
        { fail "move: complete k1"; return; }
    q "$PC" -c "SELECT outbox_enqueue('$t', 'move', '{\"n\": 1}')" >/dev/null || fail "move: enqueue"
    echo "  tenant $t (shard $shard) moves from $from to $to"
    # a coordinator session and a session on the node the tenant leaves
    # both answer for it before the move, which the second runs itself in
    # the middle (psql's \!), and after it; the nested call on the node it
    # left (a function of its own, which Citus does not delegate) read the
    # tenant's keys there before, and is refused after
    rm -f "$base/move-ready" "$base/moved"
    q "$PC" >"$base/move-coordinator.out" 2>&1 <<SQL &
SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{"amount": 1}');
\! touch $base/move-ready; while [ ! -e $base/moved ]; do sleep 0.1; done
SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{"amount": 1}');
SELECT outcome FROM idem_reserve('$t', 'move', 'k2', '{"amount": 1}');
SQL
    local coordinator=$!
    got=$(q "$from" <<SQL 2>&1
DO \$\$ BEGIN RAISE NOTICE 'before %', (SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{"amount": 1}')); END \$\$;
\! while [ ! -e $base/move-ready ]; do sleep 0.1; done; psql -X -q -A -t -v ON_ERROR_STOP=1 -p $PC -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to, shard_transfer_mode => 'block_writes')" >/dev/null; touch $base/moved
DO \$\$ BEGIN RAISE NOTICE 'after %', (SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{"amount": 1}')); END \$\$;
SQL
    )
    touch "$base/move-ready" "$base/moved"
    wait $coordinator
    case $got in *"before replay"*"shard of tenant"*"is not on this node"*) ;;
        *) fail "move: a session on $from answered: $got" ;; esac
    got=$(cat "$base/move-coordinator.out")
    [ "$got" = "replay
replay
created" ] || { fail "move: the coordinator session answered: $got"; return; }
    got=$(shard_port $t)
    [ "$got" = "$to" ] || { fail "move: the shard is on $got, not $to"; return; }
    # the new node answers from its shard, nested or not
    got=$(q "$to" -c "DO \$\$ BEGIN RAISE NOTICE 'k1 %', (SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{\"amount\": 1}')); END \$\$" 2>&1)
    case $got in *"k1 replay"*) ;; *) fail "move: a nested call on $to: $got" ;; esac
    # the tenant gets a shard of its own (isolate_tenant_to_new_shard) on
    # that node while a session there is open, which read the tenant's
    # keys before; k2, completed after the split, is replayed from the new
    # shard, not answered from the old one Citus drops later
    tok=$(q "$PC" -c "SELECT lock_token FROM idempotency.keys WHERE tenant_id = '$t' AND idem_key = 'k2'")
    got=$(q "$to" <<SQL 2>&1
DO \$\$ BEGIN RAISE NOTICE 'before %', (SELECT outcome FROM idem_reserve('$t', 'move', 'k1', '{"amount": 1}')); END \$\$;
\! psql -X -q -A -t -v ON_ERROR_STOP=1 -p $PC -c "SELECT isolate_tenant_to_new_shard('idempotency.keys', '$t', cascade_option => 'CASCADE', shard_transfer_mode => 'block_writes')" -c "SELECT idem_complete('$t', 'move', 'k2', 201, '{}', lock_token => '$tok')" >/dev/null
DO \$\$ BEGIN RAISE NOTICE 'after %', (SELECT outcome FROM idem_reserve('$t', 'move', 'k2', '{"amount": 1}')); END \$\$;
SQL
    )
    case $got in *"before replay"*"after replay"*) ;;
        *) fail "move: a session on $to across isolate_tenant_to_new_shard answered: $got" ;; esac
    got=$(q "$PC" -c "SELECT get_shard_id_for_distribution_column('idempotency.keys', '$t') <> $shard")
    [ "$got" = t ] || fail "move: the tenant has no shard of its own"
    # the outbox row moved with the keys: the node it left has none to
    # claim, the new node has it
    got=$(q "$from" -c "SELECT count(*) FROM outbox_claim('old-node', 10, tenant => '$t')")
    [ "$got" = 0 ] || fail "move: $got rows claimed on the node the tenant left"
    got=$(q "$to" -c "SELECT count(*) FROM outbox_claim('new-node', 10, tenant => '$t')")
    [ "$got" = 1 ] || fail "move: $got rows claimed on the tenant's new node, not 1"
}

suite_restart() {
    local got n=300 i wport
    # load on tenants of both workers from one coordinator session, a
    # request every 20 ms; the worker of tenant r1 restarts (immediate
    # shutdown, then start) in the middle of it
    wport=$(shard_port r1)
    (
        for i in $(seq 1 $n); do
            echo "\\echo req r$((i % 30)) k$i"
            echo "SELECT idem_execute('r$((i % 30))', 'restart', 'k$i', '{\"amount\": 1}', 'charge_handler');"
            sleep 0.02
        done
    ) | psql -X -q -A -t -p "$PC" >"$base/restart.out" 2>&1 &
    local loader=$!
    for _ in $(seq 1 600); do
        [ "$(grep -c '^(created' "$base/restart.out")" -ge 60 ] && break
        sleep 0.1
    done
    pg_ctl -D "$(node_dir "$wport")" -m immediate -w stop >/dev/null
    sleep 1
    start_node "$wport" || fail "worker $wport did not start again"
    wait $loader
    # each request's answer follows its "req" line: a reservation, or an error
    awk -v ok="$base/restart.ok" -v failed="$base/restart.failed" '
        /^req / { cur = $2 " " $3; done = 0; next }
        cur != "" && !done && /^\(/ { print cur > ok; done = 1; next }
        cur != "" && !done && /ERROR/ { print cur > failed; done = 1 }' "$base/restart.out"
    touch "$base/restart.ok" "$base/restart.failed"
    echo "  $(wc -l <"$base/restart.ok") requests committed, $(wc -l <"$base/restart.failed") failed while worker $wport was down"
    [ "$(wc -l <"$base/restart.ok")" -gt 60 ] || fail "too few requests committed"
    [ "$(cat "$base/restart.ok" "$base/restart.failed" | wc -l)" = $n ] || fail "not every request was answered"
    # everything committed is there, once
    q "$PC" -c "SELECT tenant_id || ' ' || idem_key FROM idempotency.keys
                 WHERE scope = 'restart' AND status = 'succeeded' ORDER BY 1" >"$base/restart.keys"
    got=$(sort "$base/restart.ok" | comm -23 - <(sort "$base/restart.keys") | wc -l)
    [ "$got" = 0 ] || fail "$got committed requests lost"
    got=$(q "$PC" -c "SELECT count(*) FROM (SELECT 1 FROM charges WHERE tenant_id LIKE 'r%'
                                             GROUP BY tenant_id, idem_key HAVING count(*) > 1) d")
    [ "$got" = 0 ] || fail "$got requests charged twice"
    # the retries of the failed requests run now (or replay)
    while read -r t k; do
        got=$(q "$PC" -c "SELECT idem_execute('$t', 'restart', '$k', '{\"amount\": 1}', 'charge_handler')" | outcome)
        case $got in created|replay) ;; *) fail "retry of $t $k after the restart: $got" ;; esac
    done <"$base/restart.failed"
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM idempotency.keys WHERE scope = 'restart' AND status = 'succeeded')
                      || ' ' || (SELECT count(*) FROM charges WHERE tenant_id LIKE 'r%')")
    [ "$got" = "$n $n" ] || fail "keys and charges after the retries: $got, not $n $n"

    # bindings and scopes are reference tables, changed on every node at
    # once: while a worker is down a change fails, and changes nothing
    q "$PC" -c "CREATE ROLE citus_down" >/dev/null || fail "a role for the binding"
    pg_ctl -D "$(node_dir "$wport")" -m immediate -w stop >/dev/null
    got=$(q "$PC" -c "SELECT idem_bind_tenant('citus_down', 'r1')" 2>&1)
    case $got in *ERROR*) ;; *) fail "a binding made while a worker was down: $got" ;; esac
    got=$(q "$PC" -c "SELECT idem_configure_scope('down', '{\"ttl\": \"1 hour\"}')" 2>&1)
    case $got in *ERROR*) ;; *) fail "a scope configured while a worker was down: $got" ;; esac
    start_node "$wport" || fail "worker $wport did not start again"
    got=$(q "$PC" -c "SELECT (SELECT count(*) FROM idempotency.tenant_bindings WHERE role::text = 'citus_down')
                      + (SELECT count(*) FROM idempotency.scopes WHERE scope = 'down')")
    [ "$got" = 0 ] || fail "rows left by the changes refused while a worker was down: $got"
    q "$PC" -c "SELECT idem_bind_tenant('citus_down', 'r1')" >/dev/null ||
        fail "a binding once every worker is back"
}

# Not a suite: pgbench of one-statement requests (idem_execute, a handler
# that inserts a charge; 9 in 10 keys new, 1 in 10 a retry) through the
# coordinator, then against a plain server of the same build.
citus_bench() {
    local secs=${CITUS_BENCH_SECONDS:-20} clients=${CITUS_BENCH_CLIENTS:-8}
    cat >"$base/bench.sql" <<'EOF2'
\set t random(1, 1000)
\set k random(1, 100000000)
\set r random(1, 10)
\if :r = 1
SELECT idem_execute('b:t', 'bench', 'fixed', '{"amount": 1}', 'bench_handler');
\else
SELECT idem_execute('b:t', 'bench', 'k:k', '{"amount": 1}', 'bench_handler');
\endif
EOF2
    local setup="CREATE FUNCTION bench_handler(tenant text, key text, request jsonb)
RETURNS idempotency.response LANGUAGE sql AS \$\$
    INSERT INTO public.charges (tenant_id, idem_key, amount) VALUES (tenant, key, 1);
    SELECT ROW(201, NULL, NULL)::idempotency.response;
\$\$;"
    q "$PC" -c "$setup" -c "SELECT create_distributed_function('bench_handler(text, text, jsonb)', 'tenant',
                              colocate_with => 'idempotency.keys')" >/dev/null || return
    echo "bench: Citus, coordinator + 2 workers, $clients clients, $secs s:"
    pgbench -n -p "$PC" -c "$clients" -j 2 -T "$secs" -f "$base/bench.sql" 2>&1 |
        grep -E '^(tps|number of failed|latency average)' | sed 's/^/bench:   /'

    PPLAIN=$((PW2 + 1))
    initdb -D "$(node_dir "$PPLAIN")" -U postgres --auth=trust -E UTF8 >/dev/null || return
    cat >> "$(node_dir "$PPLAIN")/postgresql.conf" <<EOF2
port = $PPLAIN
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
shared_preload_libraries = 'idempotency'
max_connections = 200
fsync = off
extension_destdir = '$IDEM_DESTDIR'
dynamic_library_path = '$lib:\$libdir'
EOF2
    start_node "$PPLAIN" || return
    q "$PPLAIN" -c "CREATE EXTENSION idempotency" \
        -c "CREATE TABLE charges (tenant_id text COLLATE \"C\" NOT NULL, idem_key text NOT NULL, amount int NOT NULL, node int)" \
        -c "$setup" >/dev/null || return
    echo "bench: plain server, $clients clients, $secs s:"
    pgbench -n -p "$PPLAIN" -c "$clients" -j 2 -T "$secs" -f "$base/bench.sql" 2>&1 |
        grep -E '^(tps|number of failed|latency average)' | sed 's/^/bench:   /'
}
