#!/usr/bin/python3
"""Input fuzzer: every function and procedure of the extension, called with
random and hostile arguments.

    call_fuzz.py [--calls N] [--seed S] [--timeout-ms MS]

Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE, ...) as a
superuser, to a database where the extension is installed (not pg_cron's
database: a scheduled maintenance job would change the tables under the
checks).  The functions and their argument types are read from the catalog
at run time (pg_depend on the extension), so new functions and changed
signatures are fuzzed without editing this file; so are the extension's
GUCs (pg_settings), set at random with SET LOCAL.

Each call runs in its own transaction, inside a savepoint:

    BEGIN; [SET LOCAL idempotency.tenant / other GUCs]; SAVEPOINT;
    [SET LOCAL ROLE]; the call; RELEASE or ROLLBACK TO; COMMIT

Violations (each one fails the run):
  - an error of class XX (internal error, XX000 "cache lookup failed",
    "unexpected ..." elog) or 58 (system error);
  - a backend crash: the fuzzing connection or a sentinel connection that
    stays idle the whole run is lost, or the server log says "terminated by
    signal" (the log is found through pg_current_logfile(), or FUZZ_SERVER_LOG);
  - a failed call that changed the tables: the extension's tables (from
    the catalog: keys, outbox, scopes, ...; row count and a checksum of
    every row) differ after ROLLBACK TO SAVEPOINT from what they were
    before the call;
  - a failed call that wrote before raising: the transaction's tuple
    counters (pg_stat_get_xact_tuples_inserted/updated/deleted) of those
    tables moved, although every write was rolled back ("bad input raises
    before any write"; cancels, lock timeouts and serialization failures
    excepted);
  - a call that does not return within 60 s although statement_timeout is
    much shorter (it does not check for interrupts).

Arguments come from pools of values the run has seen (tenants, scopes and
keys it reserved, lock and lease tokens and outbox ids returned to it) and
from hostile generators per type: NULL in any position, empty, huge,
non-printable and non-ASCII strings, deep (up to 100,000 levels) and wide JSON,
numbers at the double limits, malformed JSON Pointers, zero, negative,
mixed-sign and huge intervals, extreme integers, random uuids, fingerprints
of the wrong length.  FUZZ_SEED (or --seed) reproduces a run.
"""
import argparse
import collections
import json
import os
import random
import re
import string
import sys
import threading
import time
import uuid

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

HERE = os.path.dirname(os.path.abspath(__file__))

CATALOG = r"""
SELECT p.oid, n.nspname, p.proname, p.prokind, p.proretset,
       format_type(p.prorettype, NULL) AS rettype,
       p.pronargs, p.pronargdefaults,
       ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i) AS argtypes,
       ARRAY(SELECT typtype::text || typcategory::text FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)
               JOIN pg_type ON pg_type.oid = a.t ORDER BY i) AS argkinds,
       ARRAY(SELECT t::oid FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i) AS argoids,
       p.proargnames, p.proargmodes::text[]
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid
  JOIN pg_proc p ON p.oid = d.objid
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE d.refclassid = 'pg_extension'::regclass AND d.classid = 'pg_proc'::regclass
   AND d.deptype = 'e' AND e.extname = 'idempotency'
   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
 ORDER BY n.nspname, p.proname, p.oid
"""

# the extension's tables, from the catalog
TABLES_SQL = r"""
SELECT format('%I.%I', n.nspname, c.relname)
  FROM pg_depend d
  JOIN pg_extension e ON e.oid = d.refobjid
  JOIN pg_class c ON c.oid = d.objid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE d.refclassid = 'pg_extension'::regclass AND d.classid = 'pg_class'::regclass
   AND d.deptype = 'e' AND e.extname = 'idempotency' AND c.relkind IN ('r', 'p')
 ORDER BY 1
"""


def state_queries(tables):
    """STATE: row count and a checksum of every column of every row of each
    table (each type's own hash function: cheaper than the text form of a
    5,000-level document), then the transaction's tuple counters; COUNTERS:
    the counters alone.  The names come from the catalog, quoted by
    format('%I'), and are checked to be the extension's tables."""
    counters = [f"pg_stat_get_xact_tuples_inserted('{t}'::regclass) + pg_stat_get_xact_tuples_updated('{t}'::regclass)"
                f" + pg_stat_get_xact_tuples_deleted('{t}'::regclass)" for t in tables]
    sums = [f"(SELECT count(*)::text || ':' || coalesce(sum(hash_record_extended(t, 7)), 0)::text FROM {t} AS t)"
            for t in tables]
    return "SELECT " + ", ".join(sums + counters), "SELECT " + ", ".join(counters)


# Defects found by this fuzzer and reported, not fixed yet: their
# violations are counted and printed apart, and do not fail the run.  Remove
# an entry once its defect is fixed (the run then says it saw no more of it).
KNOWN_DEFECTS = [
]


# Errors that are not about the input: a cancel, a lock timeout or a
# serialization failure may come after a write, which the transaction's
# rollback undoes.  "Wrote before raising" does not apply to them.
NOT_INPUT_ERRORS = {"57014", "55P03", "40001", "40P01"}


class Rng(random.Random):
    def chance(self, p):
        return self.random() < p


# ---------------------------------------------------------------- value generators

PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "
HOSTILE_STRINGS = [
    "", " ", "a", "A" * 255, "A" * 256, "é" * 128, "é" * 127 + "a", "\t", "\n", "a\tb", "a\x01b",
    "\x7f", "\x1b[31m", "💳", "💳" * 64, "'", "\"", "\\", "%s", "%", "_", "'); DROP TABLE idempotency.keys; --",
    "$1", "::jsonb", "/", "~", "/~2", "NULL", "null", "true", "(other)", "pg_catalog", "public",
    "idempotency", "\u2028", "\ufeff", "\u00e9\u0301", "x" * 10000, "🔑" * 1000,
]


_ASCII = random.Random(0)
BIG_ASCII = "".join(_ASCII.choice(PRINTABLE) for _ in range(100000))


def rand_ascii(rng, n):
    if n > 300:
        start = rng.randrange(0, len(BIG_ASCII) - n)
        return BIG_ASCII[start:start + n]
    return "".join(rng.choice(PRINTABLE) for _ in range(n))


def rand_unicode(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(PRINTABLE))
        elif r < 0.6:
            out.append(chr(rng.randrange(1, 32)))
        elif r < 0.8:
            out.append(chr(rng.randrange(0x80, 0xD800)))
        elif r < 0.9:
            out.append(chr(rng.randrange(0xE000, 0x10000)))
        else:
            out.append(chr(rng.randrange(0x10000, 0x110000)))
    return "".join(out)


def gen_text(rng, pool):
    r = rng.random()
    if r < 0.45 and pool:
        return rng.choice(pool)
    if r < 0.65:
        return rng.choice(HOSTILE_STRINGS)
    if r < 0.80:
        return rand_ascii(rng, rng.choice([1, 5, 20, 254, 255, 256, 1000]))
    if r < 0.95:
        return rand_unicode(rng, rng.randrange(1, 40))
    return rng.choice(["a" * (1 << 20), "é" * 300000, rand_ascii(rng, 70000)])


NUMBERS = ["0", "-0", "1", "-1", "4.50", "1e400", "-1e400", "1e-400", "5e-324", "2.4703282292062327e-324",
           "1.7976931348623157e308", "1.7976931348623159e308", "1e23", "9007199254740993",
           "123456789012345678901234567890.123456789", "0.1", "1E+2", "1e-7", "-0.0e-0", "1e131071"]


def gen_json_value(rng, depth):
    r = rng.random()
    if depth > 0 and r < 0.25:
        n = rng.randrange(0, 6)
        return "{" + ",".join(json.dumps(gen_text(rng, ["a", "b", "amount", "ttl", ""])[:50]) + ":" +
                              gen_json_value(rng, depth - 1) for _ in range(n)) + "}"
    if depth > 0 and r < 0.4:
        return "[" + ",".join(gen_json_value(rng, depth - 1) for _ in range(rng.randrange(0, 5))) + "]"
    if r < 0.7:
        return rng.choice(NUMBERS) if rng.chance(0.3) else str(rng.randrange(-10**6, 10**6))
    if r < 0.95:
        return json.dumps(rand_unicode(rng, rng.randrange(0, 12)), ensure_ascii=rng.chance(0.5))
    return rng.choice(["true", "false", "null"])


def scope_options(rng):
    """option objects for a scope configuration (named after what the
    catalog calls the argument: options)"""
    intervals = ["1 day", "30 seconds", "0", "-1 s", "1 mon -29 days", "100000000 years", "-100000000 years",
                 "1 microsecond", "2147483647 days", "junk", "", "P1D", "infinity"]
    opts = {}
    for name in ["ttl", "lock_timeout", "cache_server_errors", "stale_action", "fingerprint_ignore", "bogus"]:
        if not rng.chance(0.4):
            continue
        r = rng.random()
        if r < 0.5:
            v = {"ttl": rng.choice(intervals), "lock_timeout": rng.choice(intervals),
                 "cache_server_errors": rng.choice([True, False]),
                 "stale_action": rng.choice(["fail", "takeover"]),
                 "fingerprint_ignore": rng.choice([["/a"], ["/metadata/sent_at", "/x/0"], []]),
                 "bogus": 1}[name]
        elif r < 0.7:
            v = rng.choice([None, 0, -1, 1e308, 86400, 0.5, "", [], {}, "fail ", "TAKEOVER", ["a"], [None],
                            ["/~2"], [""], True])
        else:
            v = rng.choice(intervals)
        opts[name] = v
    return json.dumps(opts)


def gen_jsonb(rng, argname):
    r = rng.random()
    if argname in ("options",) and r < 0.7:
        return scope_options(rng)
    if argname and "header" in argname and r < 0.5:
        return rng.choice(['{"Location": "/orders/1"}', "[]", '"x"', "null", "{}", '{"a": {"b": [1, 2]}}',
                           '{"' + "h" * 1000 + '": 1}'])
    if r < 0.55:
        return gen_json_value(rng, rng.randrange(0, 4))
    if r < 0.65:
        return rng.choice(['{"amount": 12.50, "item": "book"}', "{}", "[]", "null", "0", '""', '"\\u0000"',
                           "NaN", "{", "", '{"a": 1, "a": 2}', '"\\ud800"', "1e400", '{"x": 1e-400}',
                           '[1e308, -1e308, 5e-324]', '{"\\u20ac": 1, "\\u00e9": 2}'])
    if r < 0.72:
        n = rng.choice([100, 1000, 5000, 10000, 100000])
        return "[" * n + "1" + "]" * n if rng.chance(0.5) else '{"a":' * n + "1" + "}" * n
    if r < 0.78:
        n = rng.choice([1000, 20000])
        return "{" + ",".join(f'"k{i}": {i}' for i in range(n)) + "}"
    if r < 0.82:
        return json.dumps({"blob": "x" * rng.choice([100000, 1048576, 1100000])})
    return json.dumps(rand_unicode(rng, 30))


POINTERS = ["/a", "/a/0", "/metadata/sent_at", "/~0~1", "/", "", "-", "/-", "/0", "/00", "/01", "a", "~",
            "/~", "/~2", "/a~", "/a/~1b", "//", "/" + "x" * 10000, "/é", "/💳"]


def gen_text_array(rng, argname, pool):
    r = rng.random()
    if argname == "ignore" or r < 0.3:
        n = rng.choice([0, 1, 2, 3, 5, 100])
        return [rng.choice(POINTERS + [None] if rng.chance(0.1) else POINTERS) for _ in range(n)]
    if r < 0.6:
        return [gen_text(rng, pool) for _ in range(rng.randrange(0, 4))]
    if r < 0.7:
        return [[rng.choice(POINTERS)], [rng.choice(POINTERS)]]          # two dimensions
    if r < 0.8:
        return [None]
    return [rand_ascii(rng, 5) for _ in range(rng.choice([1000, 10000]))]


INTERVALS = ["0", "1 ms", "10 ms", "100 ms", "1 s", "30 seconds", "1 day", "-1 s", "-1 day", "1 mon -29 days",
             "-1 mon 31 days", "1 mon -31 days", "100000000 years", "-100000000 years", "177999999 years",
             "1 microsecond", "-1 microsecond", "2147483647 days", "-2147483648 days",
             "2147483647 hours", "1 year -365 days", "00:00:00.000001", "P1Y2M3DT4H5M6S"]


def gen_interval(rng):
    r = rng.random()
    if r < 0.85:
        v = rng.choice(INTERVALS)
        # long waits and pauses only rarely: statement_timeout ends them
        if rng.chance(0.9) and v in ("100000000 years", "177999999 years", "2147483647 days",
                                     "2147483647 hours", "1 day", "30 seconds"):
            v = rng.choice(["0", "1 ms", "-1 s"])
        return v
    if r < 0.95:
        return f"{rng.randrange(-10**6, 10**6)} {rng.choice(['us', 'ms', 's', 'min', 'h', 'd', 'mon', 'y'])}"
    return rng.choice(["junk", "", "infinity", "1 fortnight"])


INTS = [0, 1, -1, 2, 10, 99, 100, 199, 200, 201, 204, 299, 301, 399, 400, 404, 409, 422, 499, 500, 503, 599, 600,
        999, 1000, 1000000, 1000001, 2147483647, -2147483648]


def gen_int(rng, bits):
    r = rng.random()
    if r < 0.8:
        v = rng.choice(INTS)
    else:
        v = rng.randrange(-2**(bits - 1), 2**(bits - 1))
    if bits == 16:
        v = max(-32768, min(32767, v))
    return str(v)


def gen_bigint(rng, pool):
    r = rng.random()
    if r < 0.5 and pool:
        return str(rng.choice(pool))
    if r < 0.8:
        return str(rng.choice([0, 1, -1, 2**63 - 1, -2**63, 2**31, 10**12]))
    return str(rng.randrange(-2**63, 2**63))


def gen_uuid(rng, pool):
    r = rng.random()
    if r < 0.55 and pool:
        return rng.choice(pool)
    if r < 0.85:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return rng.choice(["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"])


def gen_bytea(rng, pool):
    r = rng.random()
    if r < 0.4 and pool:
        return rng.choice(pool)
    if r < 0.7:
        return rng.randbytes(32)
    return rng.randbytes(rng.choice([0, 1, 31, 33, 64, 1 << 20]))


def gen_float(rng):
    return rng.choice(["0", "-0", "1e308", "-1e308", "NaN", "Infinity", "-Infinity", "5e-324", "0.5", "-1"])


def gen_timestamptz(rng):
    return rng.choice(["now", "epoch", "infinity", "-infinity", "2000-01-01", "294276-12-31 23:59:59+00",
                       "4713-01-01 BC", "2024-02-30"])


# ---------------------------------------------------------------- the fuzzer

class Fuzzer:
    def __init__(self, args):
        self.args = args
        self.rng = Rng(args.seed)
        self.calls = 0
        self.by_state = collections.Counter()
        self.by_func = collections.Counter()
        self.by_func_state = collections.Counter()
        self.time_by_func = collections.Counter()
        self.examples = {}                 # sqlstate -> (call, message)
        self.violations = []
        self.known = collections.Counter()
        self.pools = collections.defaultdict(list)
        self.pools["tenant"] = ["acme", "globex", "t1"]
        self.pools["scope"] = ["orders", "payments", "s1"]
        self.pools["key"] = ["order-1", "k1", "k2"]
        self.pools["topic"] = ["payment.capture", "t"]
        self.pools["worker"] = ["w1", "w2"]
        self.reservations = []             # (tenant, scope, key, token)
        self.followup = None               # arguments for the next call
        self.outbox_rows = []              # (tenant, id, lease_token)

    # --- set-up ---------------------------------------------------------------
    def connect(self):
        conn = psycopg.connect(autocommit=True, prepare_threshold=None)
        # results stay text: a 5,000-level document is no business of Python's
        # parser, nor an interval of 100,000,000 years of its timedelta
        for t in ("json", "jsonb", "interval", "timestamptz", "timestamp", "date", "numeric"):
            conn.adapters.register_loader(t, TextLoader)
        conn.execute("SET client_min_messages = warning")
        conn.execute(f"SET statement_timeout = {int(self.args.timeout_ms)}")
        conn.execute("SET lock_timeout = '1s'")
        return conn

    def load_catalog(self):
        self.funcs = []
        # the calls' statement_timeout is not for this catalog read (slow
        # under valgrind)
        self.conn.execute("SET statement_timeout = 0")
        rows = self.conn.execute(CATALOG).fetchall()
        self.conn.execute(f"SET statement_timeout = {int(self.args.timeout_ms)}")
        for row in rows:
            (oid, nsp, name, kind, retset, rettype, nargs, ndefaults, argtypes, argkinds, argoids,
             argnames, argmodes) = row
            if argmodes:
                innames = [n for n, m in zip(argnames, argmodes) if m in ("i", "b", "v")]
            else:
                innames = list(argnames or [])
            innames += [""] * (nargs - len(innames))
            self.funcs.append(dict(oid=oid, nsp=nsp, name=name, kind=kind, retset=retset, rettype=rettype,
                                   nargs=nargs, ndefaults=ndefaults, argtypes=argtypes, argkinds=argkinds,
                                   argoids=argoids, argnames=innames))
        self.enums = {}
        for (oid, labels) in self.conn.execute(
                "SELECT enumtypid, array_agg(enumlabel::text ORDER BY enumsortorder) FROM pg_enum GROUP BY 1"):
            self.enums[oid] = labels
        self.tables = [t for (t,) in self.conn.execute(TABLES_SQL)]
        self.STATE, self.COUNTERS = state_queries(self.tables)
        self.calling_roles = ["idem_fuzz_all", "postgres", "idempotency_app", "idempotency_worker",
                              "idempotency_admin"]
        self.role_names = [r for (r,) in self.conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_' AND rolname <> ALL (%s) "
            "OR rolname = 'pg_monitor' ORDER BY 1", (self.calling_roles + [self.conn.info.user],))]
        self.role_names += ["public", "PUBLIC", "-", "pg_signal_backend", "pg_database_owner"]
        self.gucs = self.conn.execute(
            "SELECT name, vartype, context, enumvals::text[] FROM pg_settings "
            "WHERE name LIKE 'idempotency.%' AND context IN ('user', 'superuser') ORDER BY name").fetchall()
        roles = [r for (r,) in self.conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname IN "
            "('idempotency_app', 'idempotency_worker', 'idempotency_admin') ORDER BY 1")]
        self.roles = []
        if roles:
            self.conn.execute("DROP ROLE IF EXISTS idem_fuzz_all")
            self.conn.execute("CREATE ROLE idem_fuzz_all NOLOGIN")
            for r in roles + ["pg_monitor"]:
                self.conn.execute(sql.SQL("GRANT {} TO idem_fuzz_all").format(sql.Identifier(r)))
            self.roles = ["idem_fuzz_all"] * 3 + roles

    def describe(self):
        print(f"calls: seed {self.args.seed} (FUZZ_SEED={self.args.seed} reproduces), "
              f"{len(self.funcs)} functions and procedures from the catalog, {len(self.gucs)} GUCs, "
              f"running as {'the roles ' + ', '.join(sorted(set(self.roles))) + ' and a superuser' if self.roles else 'a superuser'}",
              flush=True)
        for f in self.funcs:
            args = ", ".join(f"{n} {t}" for n, t in zip(f["argnames"], f["argtypes"]))
            print(f"calls:   {f['nsp']}.{f['name']}({args})"
                  f"{' [procedure]' if f['kind'] == 'p' else ''}", flush=True)

    # --- arguments ----------------------------------------------------------
    def value(self, f, i, coherent):
        rng = self.rng
        name = f["argnames"][i]
        typ = f["argtypes"][i]
        kind = f["argkinds"][i]
        if rng.chance(self.args.null_rate):
            return None
        if coherent is not None and name in coherent:
            return coherent[name]
        pool = self.pools.get(name, [])
        if typ == "text" or typ == "character varying" or typ == "name":
            if name in ("tenant", "scope", "key", "topic", "worker", "provider_ref", "error", "recovery_point",
                        "schedule"):
                return gen_text(rng, pool if pool else ["x"])
            return gen_text(rng, pool)
        if typ == "jsonb" or typ == "json":
            return gen_jsonb(rng, name)
        if typ == "interval":
            return gen_interval(rng)
        if typ == "integer":
            return gen_int(rng, 32)
        if typ == "smallint":
            return gen_int(rng, 16)
        if typ == "bigint":
            return gen_bigint(rng, self.pools["id"] if name == "id" else [])
        if typ == "uuid":
            return gen_uuid(rng, self.pools["token"])
        if typ == "bytea":
            return gen_bytea(rng, self.pools["fingerprint"])
        if typ == "text[]":
            return gen_text_array(rng, name, self.pools.get("topic", []) if name == "topics" else pool)
        if typ == "boolean":
            return rng.choice(["true", "false"])
        if typ in ("double precision", "real", "numeric"):
            return gen_float(rng)
        if typ.startswith("timestamp"):
            return gen_timestamptz(rng)
        if typ == "regrole":
            # the roles the calls run as (and theirs) only now and then: a
            # binding of theirs refuses every other tenant
            r = rng.random()
            if r < 0.08:
                return rng.choice(self.calling_roles)
            if r < 0.85 and self.role_names:
                return rng.choice(self.role_names)
            return gen_text(rng, [])
        oid = f["argoids"][i]
        if oid in self.enums:
            return rng.choice(self.enums[oid] + ["", "bogus"])
        if kind.endswith("A"):
            return [gen_text(rng, pool)]
        return gen_text(rng, pool)          # let the type's input function judge

    def sane_value(self, f, i, coherent):
        """a valid-looking value for argument i, by its name and type"""
        rng = self.rng
        name = f["argnames"][i]
        typ = f["argtypes"][i]
        if coherent is not None and name in coherent:
            return coherent[name]
        if name in ("tenant", "scope", "key", "topic", "worker"):
            pool = [v for v in self.pools.get(name, []) if len(v) < 100]
            return rng.choice(pool) if pool and rng.chance(0.7) else \
                f"{name[0]}{rng.randrange(20)}"
        if typ in ("jsonb", "json"):
            if "header" in name:
                return rng.choice(['{"Location": "/orders/1"}', '{}'])
            if name == "options":
                return rng.choice(['{}', '{"ttl": "1 day"}', '{"stale_action": "takeover", "lock_timeout": 1}',
                                   '{"fingerprint_ignore": ["/sent_at"], "cache_server_errors": true}'])
            return json.dumps({"amount": rng.randrange(100), "item": rng.choice(["book", "pen"]),
                               "sent_at": rng.randrange(10**6)})
        if typ == "integer":
            if "code" in name:
                return str(rng.choice([200, 201, 204, 302, 400, 404, 409, 422, 500, 503]))
            return str(rng.choice([1, 2, 5, 10, 100]))
        if typ == "interval":
            return rng.choice(["0", "1 ms", "1 s", "30 seconds", "1 day"])
        if typ == "bigint":
            return str(rng.choice(self.pools["id"])) if self.pools["id"] else "1"
        if typ == "uuid":
            return rng.choice(self.pools["token"]) if self.pools["token"] else str(uuid.uuid4())
        if typ == "bytea":
            return rng.randbytes(32)
        if typ == "text[]":
            return rng.choice([None, ["/sent_at"], [rng.choice(self.pools["topic"])]])
        if typ == "text":
            return rng.choice(["step-1", "charge-requested", "HTTP 503", "ch_1", "* * * * *"])
        return self.value(f, i, coherent)

    def build_call(self, f, forced=None, sane=False):
        rng = self.rng
        nargs = f["nargs"]
        # a coherent call: tenant, scope, key and token of an earlier reservation
        coherent = None
        names = set(f["argnames"])
        if forced is not None:
            coherent = dict(forced)
        elif self.reservations and rng.chance(0.5) and {"tenant", "scope", "key"} <= names:
            t, s, k, tok = rng.choice(self.reservations)
            coherent = {"tenant": t, "scope": s, "key": k}
            if tok and rng.chance(0.7):
                coherent["lock_token"] = tok
        elif self.outbox_rows and rng.chance(0.5) and {"tenant", "id"} <= names:
            t, i, tok = rng.choice(self.outbox_rows)
            coherent = {"tenant": t, "id": str(i)}
            if tok and rng.chance(0.7):
                coherent["lease_token"] = tok
        # which arguments to pass: all, or leave out some that have defaults
        first_default = nargs - f["ndefaults"]
        npos = nargs if rng.chance(0.4) else rng.randrange(first_default, nargs + 1)
        named = []
        if sane:
            npos = first_default
        if npos < nargs and all(f["argnames"][first_default:]) and (sane or rng.chance(0.5)):
            named = [i for i in range(npos, nargs) if rng.chance(0.5 if not sane else 0.35)
                     or (sane and coherent and f["argnames"][i] in coherent)]
        # a sane call: valid-looking values, one of them (or none) hostile
        hostile = rng.choice(list(range(npos)) + named + [None]) if sane and (npos or named) else None
        if forced is not None and rng.chance(0.6):
            hostile = None
        parts = []
        params = []
        shown = []
        given = {}
        for i in list(range(npos)) + named:
            if sane and i != hostile:
                v = self.sane_value(f, i, coherent)
            else:
                v = self.value(f, i, coherent)
            params.append(v)
            given[f["argnames"][i]] = v
            typ = sql.SQL(f["argtypes"][i])     # a type name from format_type(), not user input
            ph = sql.SQL("{}::{}").format(sql.Placeholder(), typ)
            if i >= npos:
                parts.append(sql.SQL("{} => {}").format(sql.Identifier(f["argnames"][i]), ph))
            else:
                parts.append(ph)
            shown.append(f"{f['argnames'][i] or '$' + str(i + 1)}={short(v)}")
        target = sql.SQL("{}.{}").format(sql.Identifier(f["nsp"]), sql.Identifier(f["name"]))
        args_sql = sql.SQL(", ").join(parts)
        if f["kind"] == "p":
            q = sql.SQL("CALL {}({})").format(target, args_sql)
        else:
            q = sql.SQL("SELECT * FROM {}({}) LIMIT 1000").format(target, args_sql)
        return q, params, given, f"{f['name']}({', '.join(shown)})", coherent

    def gucs_sql(self):
        """SET LOCAL statements for this call: a tenant, sometimes other GUCs"""
        rng = self.rng
        out = []
        for (name, vartype, context, enumvals) in self.gucs:
            if name == "idempotency.tenant":
                if rng.chance(0.3):
                    out.append((name, rng.choice(self.pools["tenant"] + ["", "nobody", "é" * 10])))
                continue
            if not rng.chance(0.02):
                continue
            if vartype == "bool":
                v = rng.choice(["on", "off", "junk"])
            elif vartype == "enum" and enumvals:
                v = rng.choice(enumvals + ["junk"])
            elif vartype in ("integer", "real"):
                v = rng.choice(["0", "1", "-1", "100", "1kB", "2147483647", "1GB", "10s", "junk"])
            else:
                v = rng.choice(["", "x", "1 min", "-1 s", "100000000 years"])
            out.append((name, v))
        return out

    # --- one call -----------------------------------------------------------
    def state(self):
        return self.conn.execute(self.STATE).fetchone()

    def multi(self, query):
        """several statements in one round trip; the result of each SELECT"""
        cur = self.conn.cursor()
        cur.execute(query)
        out = []
        while True:
            if cur.description:
                out.append(cur.fetchone())
            if not cur.nextset():
                return out

    def run_one(self):
        rng = self.rng
        followup, self.followup = self.followup, None
        f = rng.choice(self.funcs)
        forced = None
        if followup and rng.chance(0.8):
            # the next step of what the previous call started: complete,
            # checkpoint, release... the key it reserved, ack or nack the
            # row it leased, with its token, as a role that may
            candidates = [g for g in self.funcs if set(followup) - {"lock_token", "lease_token"}
                          <= set(g["argnames"])]
            # mostly the functions that take the token
            with_token = [g for g in candidates if set(followup) & {"lock_token", "lease_token"}
                          & set(g["argnames"])]
            if with_token and rng.chance(0.8):
                candidates = with_token
            if candidates:
                f = rng.choice(candidates)
                forced = followup
        started = time.monotonic()
        sane = forced is not None or rng.chance(0.4)
        q, params, given, shown, coherent = self.build_call(f, forced, sane)
        gucs = self.gucs_sql()
        role = rng.choice(self.roles + [None] * 2) if self.roles else None
        if sane:
            role = rng.choice([None, "idem_fuzz_all"]) if self.roles else None
            gucs = [(n, v) for (n, v) in gucs if n != "idempotency.tenant"]
        iso = rng.choice(["READ COMMITTED"] * 8 + ["REPEATABLE READ", "SERIALIZABLE"])
        in_block = f["kind"] != "p" or rng.chance(0.1)
        conn = self.conn
        sqlstate = "00000"
        message = ""
        rows = []
        before = self.baseline
        shown_full = (f"{shown} [{iso if in_block else 'autocommit'}" + (f", role {role}" if role else "") +
                      "".join(f", {n}={short(v)}" for n, v in gucs) + "]")
        try:
            if in_block:
                # BEGIN; the transaction's tuple counters; [GUCs]; SAVEPOINT; [ROLE]
                counters_before = self.multi(f"BEGIN ISOLATION LEVEL {iso}; {self.COUNTERS}")[0]
                for (name, v) in gucs:
                    if name == "idempotency.tenant":
                        conn.execute("SELECT set_config(%s, %s, true)", (name, v))
                        continue
                    try:
                        conn.execute("SAVEPOINT g")
                        conn.execute("SELECT set_config(%s, %s, true)", (name, v))
                        conn.execute("RELEASE SAVEPOINT g")
                    except psycopg.Error:
                        conn.execute("ROLLBACK TO SAVEPOINT g")
                if role:
                    conn.execute(sql.SQL("SAVEPOINT c; SET LOCAL ROLE {}").format(sql.Identifier(role)))
                else:
                    conn.execute("SAVEPOINT c")
            self.call_started = (time.monotonic(), shown_full)
            try:
                cur = conn.execute(q, params)
                if cur.description:
                    rows = cur.fetchmany(1000)
            except psycopg.Error as e:
                if not e.sqlstate and not isinstance(e, psycopg.OperationalError):
                    raise           # the fuzzer's own fault (a client-side error)
                sqlstate = e.sqlstate or "?????"
                message = str(e).split("\n")[0]
            finally:
                self.call_started = None
            if sqlstate == "00000":
                self.baseline = self.multi(f"COMMIT; {self.STATE}" if in_block else self.STATE)[0]
                self.harvest(given, rows)
                if forced is not None and self.followup is None and rng.chance(0.5):
                    self.followup = forced      # the lifecycle goes on: checkpoint, complete, replay
            elif not conn.closed:
                # the tables as before the call, and nothing written meanwhile
                if in_block:
                    after = self.multi(f"ROLLBACK TO SAVEPOINT c; {self.STATE}; COMMIT")[0]
                else:
                    after = self.multi(self.STATE)[0]
                # a procedure commits batch by batch: when a cancel stops it,
                # the batches it committed stay, as they should
                committed_batches = f["kind"] == "p" and not in_block and sqlstate == "57014"
                if after[:len(self.tables)] != before[:len(self.tables)] and not committed_batches:
                    self.violation("partial write: the tables changed although the call failed", shown_full,
                                   sqlstate, message, f"before {before[:len(self.tables)]} after {after[:len(self.tables)]}")
                if after[:len(self.tables)] != before[:len(self.tables)]:
                    self.baseline = after
                if in_block and tuple(after[len(self.tables):]) != tuple(counters_before) \
                        and sqlstate not in NOT_INPUT_ERRORS:
                    self.violation("wrote before raising: tuple counters moved in a failed call", shown_full,
                                   sqlstate, message,
                                   f"counters of {', '.join(self.tables)}: {tuple(counters_before)} -> "
                                   f"{tuple(after[len(self.tables):])}")
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            if self.conn.closed or self.conn.broken:
                self.violation("connection lost (backend crash?)", shown_full,
                               getattr(e, "sqlstate", None), str(e).split("\n")[0], "")
                self.reconnect()
                sqlstate = "connection-lost"
            else:
                raise
        if self.args.trace:
            print(f"calls: trace: {shown_full[:300]} -> {sqlstate} {message[:120]}"
                  f"{' [follow-up]' if forced is not None else ''}", flush=True)
        self.calls += 1
        self.time_by_func[f["name"]] += time.monotonic() - started
        self.by_state[sqlstate] += 1
        self.by_func[f["name"]] += 1
        self.by_func_state[(f["name"], sqlstate)] += 1
        if sqlstate not in self.examples:
            self.examples[sqlstate] = (shown_full, message)
        cls = sqlstate[:2]
        if cls in ("XX", "58"):
            self.violation(f"error of class {cls}", shown_full, sqlstate, message, "")

    def trim(self):
        """keep the tables small, so that the checksum of every row after
        every call stays cheap: the fuzzer's own housekeeping, between calls"""
        for t in ("idempotency.keys", "idempotency.outbox"):
            if t not in self.tables:
                continue
            n = self.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            if n > 500:
                self.conn.execute(f"DELETE FROM {t} WHERE random() < 0.5")
        if "idempotency.tenant_bindings" in self.tables and self.rng.chance(0.5):
            # a binding of the roles the calls run as refuses every other
            # tenant: let it live for a while only
            self.conn.execute("DELETE FROM idempotency.tenant_bindings")
        self.conn.execute("DELETE FROM idempotency.keys WHERE pg_column_size(response_body) "
                          "+ coalesce(pg_column_size(response_headers), 0) > 4000")
        self.conn.execute("DELETE FROM idempotency.outbox WHERE pg_column_size(payload) + "
                          "coalesce(pg_column_size(headers), 0) > 4000")
        self.baseline = self.state()

    def watchdog(self):
        """a call that runs 60 s although statement_timeout is far shorter
        does not check for interrupts: report it and cancel it harder"""
        conn = psycopg.connect(autocommit=True)
        while True:
            time.sleep(5)
            started = self.call_started
            if started and time.monotonic() - started[0] > 60:
                self.violation("no answer within 60 s (statement_timeout not honoured)", started[1],
                               None, "", "")
                try:
                    conn.execute("SELECT pg_terminate_backend(%s)", (self.backend_pid,))
                except psycopg.Error:
                    pass
                self.call_started = None

    def harvest(self, given, rows):
        """remember what the call created, for later calls"""
        for n in ("tenant", "scope", "key", "topic", "worker"):
            v = given.get(n)
            if isinstance(v, str) and len(v) < 300 and v not in self.pools[n]:
                self.pools[n].append(v)
                if len(self.pools[n]) > 50:
                    self.pools[n].pop(0)
        for row in rows[:20]:
            for v in row:
                if isinstance(v, uuid.UUID):
                    self.pools["token"].append(str(v))
                elif isinstance(v, bytes) and len(v) == 32:
                    self.pools["fingerprint"].append(v)
            tok = next((str(v) for v in row if isinstance(v, uuid.UUID)), None)
            if {"tenant", "scope", "key"} <= set(given) and all(isinstance(given[n], str) for n in ("tenant", "scope", "key")):
                self.reservations.append((given["tenant"], given["scope"], given["key"], tok))
                if tok:
                    self.followup = {"tenant": given["tenant"], "scope": given["scope"],
                                     "key": given["key"], "lock_token": tok}
            # outbox rows: (tenant_id, id, ...) from a claim, or an id from enqueue
            if len(row) == 1 and isinstance(row[0], int) and "payload" in given:
                self.pools["id"].append(row[0])
                if isinstance(given.get("tenant"), str):
                    self.outbox_rows.append((given["tenant"], row[0], None))
            elif len(row) > 3 and isinstance(row[0], str) and isinstance(row[1], int) and tok:
                self.pools["id"].append(row[1])
                self.outbox_rows.append((row[0], row[1], tok))
                self.followup = {"tenant": row[0], "id": str(row[1]), "lease_token": tok}
        for p in ("token", "fingerprint", "id"):
            del self.pools[p][:-100]
        del self.reservations[:-200]
        del self.outbox_rows[:-200]

    def violation(self, what, call, sqlstate, message, detail):
        for (name, _desc, match) in KNOWN_DEFECTS:
            if match(what, sqlstate, message):
                self.known[name] += 1
                if self.known[name] == 1:
                    print(f"calls: known defect {name}: {what}: {call[:300]} -> {sqlstate} {message}",
                          flush=True)
                return
        self.violations.append((what, call, sqlstate, message, detail))
        print(f"calls: VIOLATION: {what}: {call} -> {sqlstate} {message} {detail}", flush=True)

    def reconnect(self):
        time.sleep(2)
        for _ in range(30):
            try:
                self.conn = self.connect()
                self.backend_pid = self.conn.info.backend_pid
                self.baseline = self.state()
                return
            except psycopg.OperationalError:
                time.sleep(1)
        sys.exit("calls: the server does not come back")

    def server_log(self):
        path = os.environ.get("FUZZ_SERVER_LOG")
        if not path:
            try:
                rel = self.conn.execute("SELECT pg_current_logfile()").fetchone()[0]
                if rel:
                    datadir = self.conn.execute("SHOW data_directory").fetchone()[0]
                    path = rel if rel.startswith("/") else os.path.join(datadir, rel)
            except psycopg.Error:
                path = None
        return path

    def log_crashes(self, path, offset):
        if not path or not os.access(path, os.R_OK):
            return None
        with open(path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", "replace")
        return [l for l in text.splitlines() if "terminated by signal" in l or "was terminated by exception" in l]

    def run(self):
        self.conn = self.connect()
        self.backend_pid = self.conn.info.backend_pid
        self.sentinel = psycopg.connect(autocommit=True)
        sentinel_pid = self.sentinel.info.backend_pid
        self.load_catalog()
        self.describe()
        log_path = self.server_log()
        log_offset = os.path.getsize(log_path) if log_path and os.access(log_path, os.R_OK) else 0
        self.baseline = self.state()
        self.call_started = None
        threading.Thread(target=self.watchdog, daemon=True).start()
        t0 = time.monotonic()
        last = t0
        while self.calls < self.args.calls:
            self.run_one()
            if self.calls % 100 == 0:
                self.trim()
            now = time.monotonic()
            if now - last > 30:
                last = now
                print(f"calls: {self.calls}/{self.args.calls}, {len(self.violations)} violations, "
                      f"{now - t0:.0f} s", flush=True)
        elapsed = time.monotonic() - t0
        # the sentinel stayed idle all along: a crash of any backend ends it
        try:
            if self.sentinel.execute("SELECT pg_backend_pid()").fetchone()[0] != sentinel_pid:
                raise psycopg.OperationalError("another backend")
        except psycopg.Error as e:
            self.violation("the sentinel connection was lost: a backend crashed", "", None, str(e), "")
        crashes = self.log_crashes(log_path, log_offset)
        if crashes:
            for l in crashes:
                self.violation("server log", "", None, l, "")
        self.report(elapsed, log_path if crashes is not None else None)
        return 1 if self.violations else 0

    def report(self, elapsed, log_path):
        print(f"calls: {self.calls} calls in {elapsed:.1f} s ({self.calls / elapsed:.0f}/s), "
              f"{len(self.funcs)} functions; server log "
              f"{'checked: ' + log_path if log_path else 'not readable here (crashes detected by the connections)'}")
        hist = ", ".join(f"{k} {v}" for k, v in sorted(self.by_state.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"calls: SQLSTATEs: {hist}")
        if self.args.verbose:
            for name in sorted(self.by_func):
                states = ", ".join(f"{s} {n}" for (fn, s), n in sorted(self.by_func_state.items()) if fn == name)
                print(f"calls:   {name}: {self.by_func[name]} calls, {self.time_by_func[name]:.1f} s: {states}")
            for s in sorted(self.examples):
                call, msg = self.examples[s]
                print(f"calls:   e.g. {s}: {msg[:160]}\n            {call[:300]}")
        for (name, desc, _m) in KNOWN_DEFECTS:
            print(f"calls: known defect {name} ({desc}): {self.known[name]} occurrences"
                  f"{'' if self.known[name] else ' (fixed? then remove it from KNOWN_DEFECTS)'}")
        print(f"calls: {len(self.violations)} violations")
        for v in self.violations[:20]:
            print(f"calls: VIOLATION {v[0]}: {v[1][:500]} -> {v[2]} {v[3]} {v[4]}")


def short(v):
    if v is None:
        return "NULL"
    if isinstance(v, bytes):
        return f"bytea[{len(v)}]"
    if isinstance(v, list):
        s = json.dumps(v, ensure_ascii=True)
    else:
        s = json.dumps(v, ensure_ascii=True)
    return s if len(s) <= 60 else s[:40] + f"...({len(s)} chars)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--seed", type=int,
                    default=int(os.environ.get("FUZZ_SEED") or random.randrange(1, 2**31)))
    ap.add_argument("--timeout-ms", type=int, default=2000, help="statement_timeout of each call")
    ap.add_argument("--null-rate", type=float, default=0.06)
    ap.add_argument("--verbose", action="store_true", help="per-function SQLSTATEs and an example of each")
    ap.add_argument("--trace", action="store_true", help="every call and its SQLSTATE")
    args = ap.parse_args()
    return Fuzzer(args).run()


if __name__ == "__main__":
    sys.exit(main())
