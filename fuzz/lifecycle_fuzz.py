#!/usr/bin/python3
"""Model-based, multi-session randomized test of the idempotency key lifecycle.

Usage (fuzz/run.sh runs it in a database of its own):
  /usr/bin/python3 fuzz/lifecycle_fuzz.py [--dsn 'host=... dbname=...'] \
        [--seeds 1-200 | --seed 42] [--ops 60] [--sessions 4] [--verbose] [--trace]

Needs psycopg 3 (Debian: python3-psycopg) and a database where the extension is
installed, shared_preload_libraries has 'idempotency' (for the stats view) and
track_commit_timestamp = on (committed changes are replayed into the model in
commit order); without --dsn, the libpq environment (PGHOST, PGDATABASE, ...).
The role must be a superuser or hold idempotency_app + idempotency_admin and be
able to create a table. The first run creates table public.fz_exec (the
"business executions") and configures scopes 'fz_fail' (stale_action fail),
'fz_take' (stale_action takeover) and 'fz_cache' (takeover, cache_server_errors,
retryable_codes [409]), all with a 500 ms lock_timeout and 1 h ttl.
idem_stats_reset() is called before each schedule: do not point it at a database
whose statistics matter, and run parallel instances in separate databases.

Each seed drives one schedule: N sessions (asyncio, one connection each) plus
an admin session interleave BEGIN/COMMIT/ROLLBACK, SAVEPOINT/ROLLBACK TO,
idem_reserve (with or without wait, sometimes another body), the business
write (in the same statement, only when reserve answers 'created'),
idem_complete (2xx/4xx/5xx, retryable), idem_release, idem_checkpoint (with the
right, a missing or a superseded lock_token), idem_resolve, idem_sweep and
pg_terminate_backend, over 2 tenants x 3 scopes x 2 keys; 20 % of transactions
are REPEATABLE READ. Answers are checked against a model of the committed state
of every key (with timing intervals for the lock_timeout boundary and for
concurrent commits), and at the end: committed executions vs committed
'created', the keys table vs the model, every replay vs the stored response,
stats view vs the answers, SQLSTATEs vs the documented ones. Exit status 1 if
a schedule found a violation; the seed and its violations are printed
(--verbose adds the schedule's trace, --trace prints every operation as it
runs). Schedules depend on timing as well as on the seed: a failing seed shows
what to look at, and may need a few runs to reproduce.
About 4 s per schedule on 2 cores.
"""
import argparse, asyncio, json, random, sys, time, uuid
import psycopg

LOCK_TIMEOUT = 0.5
SCOPES = {'fz_fail': 'fail', 'fz_take': 'takeover', 'fz_cache': 'takeover'}
# scope options besides lock_timeout / stale_action / ttl
SCOPE_EXTRA = {'fz_cache': {'cache_server_errors': True, 'retryable_codes': [409]}}
ALLOWED = {  # documented SQLSTATEs per call (plus our own timeouts / kills)
    'reserve': {'40P01', '57014'},
    'complete': {'55006', 'P0002', '55000', '55P03', '40P01', '57014'},
    'release': {'55006', 'P0002', '55000', '55P03', '40P01', '57014'},
    'checkpoint': {'55006', 'P0002', '55000', '55P03', '40P01', '57014'},
    'resolve': {'P0002', '55000', '55P03', '57014'},
    'sweep': {'57014'},
}
STAT_OF = {'created': 'created', 'replay': 'replayed', 'in_progress': 'in_progress',
           'mismatch': 'mismatched', 'stale': 'stale'}


class Violation(Exception):
    pass


class KeyState:
    """Committed state of one key."""
    def __init__(self, status='absent', fp=None, token=None, locked=(0, 0),
                 flagged=False, code=None, body=None, headers=None):
        self.status, self.fp, self.token, self.locked = status, fp, token, locked
        self.flagged, self.code, self.body, self.headers = flagged, code, body, headers

    def copy(self, **kw):
        s = KeyState(self.status, self.fp, self.token, self.locked, self.flagged,
                     self.code, self.body, self.headers)
        for k, v in kw.items():
            setattr(s, k, v)
        return s

    def __repr__(self):
        if self.status == 'absent':
            return 'absent'
        if self.status == 'processing':
            return 'processing(fp=%s tok=%s locked=%.3f..%.3f flag=%s)' % (
                self.fp, str(self.token)[:8], self.locked[0] % 1000, self.locked[1] % 1000, self.flagged)
        return '%s(fp=%s %s %s)' % (self.status, self.fp, self.code, json.dumps(self.body))


class Sched:
    def __init__(self, args, seed):
        self.args, self.seed = args, seed
        self.rng = random.Random(seed)
        run = '%x' % (int(time.time() * 1000) % 0xffffff)   # fresh tenants on every run
        self.tenants = ['fz%d_%sa' % (seed, run), 'fz%d_%sb' % (seed, run)]
        self.keys = [(t, s, k) for t in self.tenants for s in SCOPES for k in ('k1', 'k2')]
        # per key: list of (c0, c1, KeyState): state valid from a commit in [c0, c1]
        self.hist = {k: [(0.0, 0.0, KeyState())] for k in self.keys}
        self.trace = []
        self.violations = []
        self.counts = {}     # (tenant, scope) -> counter -> n
        self.attempt = 0
        self.committed_created = {}   # attempt -> key
        self.replays = {k: [] for k in self.keys}
        self.tokens = {k: [] for k in self.keys}   # every token ever handed out
        self.lockers = []    # (sess, key, t_start, txn) lock-taking ops (for in_progress)
        self.inflight = []   # [sess, key, t0, t1] ops on keys, t1 None while in flight
        self.n = 0
        self.deferred = []
        self.commits = []    # (xid, actions): applied in commit-timestamp order at the end

    # ---------------------------------------------------------------- helpers
    def log(self, *a):
        line = '%8.3f %s' % (time.time() % 1000, ' '.join(str(x) for x in a))
        self.trace.append(line)
        if self.args.trace:
            print(line, flush=True)

    def violate(self, msg):
        self.log('VIOLATION', msg)
        self.violations.append(msg)

    def count(self, key, stat, n=1):
        c = self.counts.setdefault((key[0], key[1]), {})
        c[stat] = c.get(stat, 0) + n

    def cur(self, key):
        return self.hist[key][-1][2]

    def candidates(self, key, t0, t1):
        """Committed states a call running in [t0, t1] may have seen."""
        h = self.hist[key]
        out = []
        for i, (c0, c1, st) in enumerate(h):
            end_hi = h[i + 1][1] if i + 1 < len(h) else float('inf')
            if c0 <= t1 and end_hi >= t0:
                out.append(st)
        return out

    def apply(self, key, st, c0, c1):
        self.hist[key].append((c0, c1, st))

    @staticmethod
    def may_be_stale(st, t0, t1):
        return st.status == 'processing' and t1 - st.locked[0] >= LOCK_TIMEOUT - 0.002

    @staticmethod
    def may_be_fresh(st, t0, t1):
        return st.status == 'processing' and t0 - st.locked[1] < LOCK_TIMEOUT + 0.002

    def other_lock_possible(self, sess, key, t0, t1):
        """Could another session hold the key's lock at some time in [t0, t1]?"""
        for (s, k, ts, txn) in self.lockers:
            if s is sess or k != key or ts > t1:
                continue
            end = txn['end'] if txn is not None else None
            if end is None or end >= t0:
                return True
        for (s, k, a, b) in self.inflight:
            if s is not sess and k == key and a <= t1 and (b is None or b >= t0):
                return True
        return False

    def other_lock_certain(self, sess, key, t0):
        """Does another session's open transaction surely hold the key at t0?"""
        for s in self.sessions:
            if s is sess or s.txn is None or s.busy:
                continue   # a statement of s in flight may have ended its transaction
            if s.txn.get('end_start') is not None and s.txn['end_start'] <= t0:
                continue
            for a in s.txn['actions']:
                if a['key'] == key and a['kind'] in ('created', 'stale_flag', 'complete', 'release', 'checkpoint') and a['t1'] < t0:
                    return a
        return None


class Session:
    def __init__(self, sc, idx):
        self.sc, self.idx = sc, idx
        self.conn = None
        self.txn = None      # dict(actions=[...], sp=[...], failed=bool, end=None)
        self.busy = False

    def __repr__(self):
        return 'S%d' % self.idx

    async def connect(self):
        self.conn = await psycopg.AsyncConnection.connect(self.sc.args.dsn, autocommit=True)
        await self.conn.execute("SET lock_timeout = '300ms'; SET statement_timeout = '4s'")
        r = await (await self.conn.execute('SELECT pg_backend_pid()')).fetchone()
        self.pid = r[0]


def uuid_str(u):
    return None if u is None else str(u)


async def run_schedule(args, seed):
    sc = Sched(args, seed)
    rng = sc.rng
    admin = await psycopg.AsyncConnection.connect(args.dsn, autocommit=True)
    await admin.execute("SET statement_timeout = '10s'; SET lock_timeout = '300ms'")
    await admin.execute('SELECT idem_stats_reset()')
    sc.sessions = [Session(sc, i) for i in range(args.sessions)]
    for s in sc.sessions:
        await s.connect()
    sc.log('seed', seed, 'tenants', sc.tenants)

    def pick_key():
        return rng.choice(sc.keys)

    def known_token(key, s):
        """A token for key: mostly the latest, sometimes an old one or none."""
        toks = sc.tokens[key]
        r = rng.random()
        if r < 0.12:
            return None
        if r < 0.2:
            return str(uuid.UUID(int=rng.getrandbits(128)))
        if not toks:
            return None
        if r < 0.35:
            return rng.choice(toks)
        return toks[-1]

    # ------------------------------------------------------------- commit model
    def own_holds(s, key, token):
        """Does s's open transaction hold key with this token (None: own)?"""
        if s.txn is None:
            return False
        held = None
        for a in s.txn['actions']:
            if a['key'] != key:
                continue
            if a['kind'] == 'created' or (a['kind'] == 'checkpoint'):
                held = a['token']
            elif a['kind'] in ('complete', 'release'):
                held = None
        if held is None:
            return False
        return token is None or token == held

    def commit_actions(actions, c0, c1):
        for a in actions:
            key = a['key']
            st = sc.cur(key)
            k = a['kind']
            if k == 'created':
                sc.committed_created[a['attempt']] = key
                ok = (st.status == 'absent' or
                      (st.status == 'processing' and SCOPES[key[1]] == 'takeover' and not st.flagged
                       and Sched.may_be_stale(st, a['t0'], a['t1'])))
                if a.get('own_prior'):
                    ok = True   # own earlier action in this txn changed the state
                if not ok:
                    sc.violate('DOUBLE HOLDER: created %s for %s committed over %r' % (a['attempt'], key, st))
                sc.apply(key, KeyState('processing', a['fp'], a['token'], (a['t0'], a['t1'])), c0, c1)
            elif k == 'sweep_flag':
                if st.status == 'processing' and st.token == a['token'] and not st.flagged:
                    if SCOPES[key[1]] == 'takeover':
                        sc.violate('sweep flagged a takeover key before its expiry: %s' % (key,))
                    if a['t1'] - st.locked[0] < a['thr'] - 0.002:
                        sc.violate('sweep flagged %s younger than %s' % (key, a['thr']))
                    sc.apply(key, st.copy(flagged=True), c0, c1)
            elif k == 'stale_flag':
                # a stale answer from a row every state the call may have
                # seen had flagged writes nothing and takes no lock: a
                # checkpoint may clear the flag before the answering
                # transaction commits, and that commit does not set it again
                if st.status == 'processing' and not all(
                        c.status == 'processing' and c.flagged
                        for c in sc.candidates(key, a['t0'], a['t1'])):
                    sc.apply(key, st.copy(flagged=True), c0, c1)
            elif k == 'checkpoint':
                if st.status != 'processing' or (a['token'] is not None and st.token != a['token'] and not a.get('own_prior')):
                    sc.violate('FENCE: checkpoint with %s committed over %r' % (a['token'], st))
                # the attempt is alive: its checkpoint clears the flag
                sc.apply(key, st.copy(locked=(a['t0'], a['t1']), flagged=False), c0, c1)
            elif k in ('complete', 'resolve'):
                if st.status != 'processing' or (k == 'complete' and a['token'] is not None and st.token != a['token'] and not a.get('own_prior')):
                    sc.violate('FENCE: %s with %s committed over %r' % (k, a['token'], st))
                if a['stored']:
                    sc.apply(key, KeyState('succeeded' if a['code'] < 400 else 'failed', st.fp if st.status != 'absent' else a.get('fp'),
                                           None, code=a['code'], body=a['body'], headers=a['headers']), c0, c1)
                else:
                    sc.apply(key, KeyState(), c0, c1)
            elif k == 'release':
                if st.status != 'processing' or (a['token'] is not None and st.token != a['token'] and not a.get('own_prior')):
                    sc.violate('FENCE: release with %s committed over %r' % (a['token'], st))
                sc.apply(key, KeyState(), c0, c1)

    # --------------------------------------------------------------- operations
    async def stmt(s, sql, params=()):
        cur = await s.conn.execute(sql, params)
        try:
            return await cur.fetchall()
        except psycopg.ProgrammingError:
            return None

    def record(s, kind, key, t0, t1, **kw):
        a = dict(kind=kind, key=key, t0=t0, t1=t1, **kw)
        # own_prior: this txn already changed the key before (model state is its own)
        if s.txn is not None:
            a['own_prior'] = any(b['key'] == key for b in s.txn['actions'])
            a['sp_level'] = len(s.txn['sp'])
        return a

    async def do_key_op(s, op):
        key = pick_key()
        if op != 'reserve':
            # aim completions mostly at keys that are held (by us, or committed two-phase)
            mine = [a['key'] for a in (s.txn['actions'] if s.txn else []) if a['kind'] == 'created']
            r = rng.random()
            if mine and r < 0.5:
                key = rng.choice(mine)
            elif r < 0.8:
                live = [k for k in sc.keys if sc.tokens[k]]
                if live:
                    key = rng.choice(live)
        if s.txn is not None and s.txn['failed']:
            return await end_txn(s, 'ROLLBACK' if rng.random() < 0.7 or not s.txn['sp'] else 'ROLLBACK TO')
        autocommit = s.txn is None
        tenant, scope, k = key
        sc.n += 1
        entry = [s, key, time.time(), None]
        sc.inflight.append(entry)
        t0 = time.time()
        if s.txn is not None:
            sc.lockers.append((s, key, t0, s.txn))
        else:
            sc.lockers.append((s, key, t0, {'end': None, '_auto': True}))
        auto_holder = sc.lockers[-1][3]
        err = None
        res = None
        try:
            if op == 'reserve':
                sc.attempt += 1
                att = sc.attempt
                fp = 'A' if rng.random() < 0.9 else 'B'
                wait = rng.choice(['0', '0', '0', '300 milliseconds', '1 second'])
                q = ("WITH r AS MATERIALIZED (SELECT * FROM idem_reserve(%s, %s, %s, %s::jsonb, wait => %s::interval)),"
                     " w AS (INSERT INTO fz_exec SELECT %s, %s, %s, %s, r.lock_token, %s FROM r WHERE r.outcome = 'created' RETURNING 1)"
                     " SELECT r.outcome::text, r.response_code, r.response_body, r.response_headers, r.lock_token, r.recovery_point, (SELECT count(*) FROM w),"
                     " pg_current_xact_id_if_assigned()::text FROM r")
                rows = await stmt(s, q, (tenant, scope, k, json.dumps({'v': fp}), wait, tenant, scope, k, att, s.idx))
                t1 = time.time()
                outcome, code, body, headers, token, rp, nw, xid = rows[0]
                token = uuid_str(token)
                sc.log(s, 'reserve', key, fp, 'wait=' + wait, '->', outcome, code, json.dumps(body), str(token)[:8], 'rp=%s' % rp, '[%.3f..%.3f]' % (t0 % 1000, t1 % 1000))
                sc.count(key, STAT_OF.get(outcome, outcome))
                check_reserve(s, key, fp, outcome, code, body, headers, token, t0, t1, wait)
                if outcome == 'created':
                    if nw != 1:
                        sc.violate('created without business write?')
                    sc.tokens[key].append(token)
                    a = record(s, 'created', key, t0, t1, token=token, attempt=att, fp=fp)
                    if autocommit:
                        sc.commits.append((xid, [a]))
                    else:
                        s.txn['actions'].append(a)
                elif outcome == 'stale' and SCOPES[scope] == 'fail':
                    a = record(s, 'stale_flag', key, t0, t1)
                    if autocommit and xid is None:
                        pass   # answered from a flagged row: nothing written
                    elif autocommit:
                        sc.commits.append((xid, [a]))
                    else:
                        s.txn['actions'].append(a)
                elif outcome == 'replay' and not any(a['key'] == key for a in (s.txn['actions'] if s.txn else [])):
                    sc.replays[key].append((code, body, headers, s, t0, t1))
            elif op in ('complete', 'release', 'checkpoint'):
                own = own_holds(s, key, None)
                token = None if (own and rng.random() < 0.5) else known_token(key, s)
                if op == 'complete':
                    code = rng.choice([200, 201, 201, 404, 409, 500, 503])
                    retry = rng.random() < 0.1
                    body = {'attempt_of': token, 'n': sc.n}
                    headers = {'x': str(sc.n)}
                    rows = await stmt(s, 'SELECT idem_complete(%s, %s, %s, %s, %s::jsonb, %s::jsonb, lock_token => %s::uuid, retryable => %s)::text, pg_current_xact_id_if_assigned()::text',
                                      (tenant, scope, k, code, json.dumps(body), json.dumps(headers), token, retry))
                    t1 = time.time()
                    status, xid = rows[0]
                    stored = status is not None
                    extra = SCOPE_EXTRA.get(scope, {})
                    expect = (not retry and code not in extra.get('retryable_codes', [])
                              and (code < 500 or extra.get('cache_server_errors', False)))
                    if stored != expect:
                        sc.violate('complete %s retry=%s returned %s' % (code, retry, status))
                    sc.count(key, 'completed' if stored else 'released')
                    sc.log(s, 'complete', key, code, 'retry=%s' % retry, 'tok=%s' % str(token)[:8], '->', status)
                    a = record(s, 'complete', key, t0, t1, token=token, code=code, body=body, headers=headers, stored=stored)
                elif op == 'release':
                    rows = await stmt(s, 'SELECT idem_release(%s, %s, %s, %s::uuid), pg_current_xact_id_if_assigned()::text', (tenant, scope, k, token))
                    xid = rows[0][1]
                    t1 = time.time()
                    sc.count(key, 'released')
                    sc.log(s, 'release', key, 'tok=%s' % str(token)[:8], '-> ok')
                    a = record(s, 'release', key, t0, t1, token=token)
                else:
                    rows = await stmt(s, 'SELECT idem_checkpoint(%s, %s, %s, %s, %s::uuid), pg_current_xact_id_if_assigned()::text', (tenant, scope, k, 'rp%d' % sc.n, token))
                    xid = rows[0][1]
                    t1 = time.time()
                    sc.log(s, 'checkpoint', key, 'tok=%s' % str(token)[:8], '-> ok')
                    a = record(s, 'checkpoint', key, t0, t1, token=token if token else own_token(s, key))
                check_fenced_success(s, op, key, token, t0, t1, own)
                if autocommit:
                    sc.commits.append((xid, [a]))
                else:
                    s.txn['actions'].append(a)
        except psycopg.Error as e:
            t1 = time.time()
            err = e.sqlstate
            sc.log(s, op, key, '-> ERROR', err, str(e).splitlines()[0][:150])
            if err not in ALLOWED[op] and not (err == '40001' and s.txn is not None and s.txn.get('rr')):
                sc.violate('undocumented SQLSTATE %s from %s: %s' % (err, op, e))
            if op in ('complete', 'release', 'checkpoint') and own_holds(s, key, None) and err not in ('57014', '55P03', '40P01'):
                # our own transaction holds the key; unless we passed a wrong token it must work
                pass
            if s.txn is not None:
                # PostgreSQL aborts at the error: the whole transaction (its locks go
                # now), or with a savepoint the innermost subtransaction only
                s.txn['failed'] = True
                if s.txn['sp']:
                    undo_to_savepoint(s, t1)
                else:
                    s.txn['actions'] = []
                    s.txn['end_start'] = t0
                    s.txn['end'] = t1
        finally:
            entry[3] = time.time()
            if autocommit:
                auto_holder['end'] = time.time()

    def own_age(s, key, t):
        last = None
        for a in s.txn['actions']:
            if a['key'] == key and a['kind'] in ('created', 'checkpoint'):
                last = a['t0']
        return t - last if last is not None else 0

    def own_token(s, key):
        if s.txn is None:
            return None
        held = None
        for a in s.txn['actions']:
            if a['key'] == key and a['kind'] in ('created', 'checkpoint'):
                held = a['token'] or held
        return held

    def check_fenced_success(s, op, key, token, t0, t1, own):
        if own and (token is None or token == own_token(s, key)):
            return
        sc.deferred.append(lambda: check_fenced_later(s, op, key, token, t0, t1))

    def check_fenced_later(s, op, key, token, t0, t1):
        cands = sc.candidates(key, t0, t1)
        if token is None:
            sc.violate('%s without token succeeded on %s, which this txn does not hold (states %r)' % (op, key, cands))
            return
        if not any(st.status == 'processing' and st.token == token for st in cands):
            sc.violate('FENCE: %s with token %s succeeded; committed states %r' % (op, token[:8], cands))

    def local_view(acts, key, cands, now):
        """The states s's own open transaction sees: its own actions on top."""
        if not acts:
            return cands
        # the committed state may change after our first action unless we hold the
        # key's lock (a stale answer from a flagged row takes none): every state from
        # our first action to now
        base = sc.candidates(key, acts[0]['t0'] - 0.002, now)
        out = []
        for st in base:
            for a in acts:
                k = a['kind']
                if k == 'created':
                    st = KeyState('processing', a['fp'], a['token'], (a['t0'], a['t1']))
                elif k == 'stale_flag':
                    st = st.copy(flagged=True)
                elif k == 'checkpoint':
                    st = st.copy(locked=(a['t0'], a['t1']), flagged=False)
                elif k == 'complete':
                    st = (KeyState('succeeded' if a['code'] < 400 else 'failed', st.fp, None, code=a['code'],
                                   body=a['body'], headers=a['headers']) if a['stored'] else KeyState())
                elif k == 'release':
                    st = KeyState()
            out.append(st)
        return out

    def check_reserve(s, key, fp, outcome, code, body, headers, token, t0, t1, wait):
        scope_kind = SCOPES[key[1]]
        w = {'0': 0, '300 milliseconds': 0.3, '1 second': 1.0}[wait]
        acts = [dict(a) for a in (s.txn['actions'] if s.txn else []) if a['key'] == key]
        oh = own_holds(s, key, None)
        own = oh or bool(acts)
        oage = own_age(s, key, t1) if s.txn else 0
        if outcome == 'created':
            holder = sc.other_lock_certain(s, key, t0)
            if holder is not None:
                sc.violate('DOUBLE HOLDER: %s got created for %s while another open txn holds it (%s)' % (s, key, holder['kind']))
        rr_t0 = s.txn['begin_t'] if (s.txn is not None and s.txn.get('rr')) else None
        if outcome == 'in_progress' and w > 0 and not own and rr_t0 is None:
            # with wait, in_progress only after waiting (unless the holder is still there)
            if t1 - t0 < w - 0.05:
                sc.violate('reserve wait=%s answered in_progress after %.3fs' % (wait, t1 - t0))
        t0c = rr_t0 if rr_t0 is not None else t0   # REPEATABLE READ answers from the snapshot
        sc.deferred.append(lambda: check_reserve_later(s, key, fp, outcome, code, body, headers, t0c, t1, acts, oh, own, oage))

    def check_reserve_later(s, key, fp, outcome, code, body, headers, t0, t1, acts, oh, own, oage):
        scope_kind = SCOPES[key[1]]
        cands = local_view(acts, key, sc.candidates(key, t0 - 0.002, t1), t1)
        others = sc.other_lock_possible(s, key, t0, t1)
        ok = False
        for st in cands:
            if outcome == 'created':
                if oh:
                    continue
                if own:
                    ok = True
                if st.status == 'absent':
                    ok = True
                elif (st.status == 'processing' and scope_kind == 'takeover' and not st.flagged and st.fp == fp
                      and Sched.may_be_stale(st, t0, t1)):
                    ok = True
            elif outcome == 'replay':
                if st.status in ('succeeded', 'failed') and st.fp == fp and (code, body, headers) == (st.code, st.body, st.headers):
                    ok = True
            elif outcome == 'mismatch':
                if st.status != 'absent' and st.fp != fp:
                    ok = True
            elif outcome == 'stale':
                if st.status == 'processing' and st.fp == fp and (st.flagged or (scope_kind == 'fail' and Sched.may_be_stale(st, t0, t1))):
                    ok = True
            elif outcome == 'in_progress':
                if own or others:
                    ok = True
                elif st.status == 'processing' and st.fp == fp and Sched.may_be_fresh(st, t0, t1) and not st.flagged:
                    ok = True
        if outcome == 'in_progress' and (own or others):
            ok = True
        if not ok:
            sc.violate('reserve %s fp=%s answered %s (code=%s body=%s); committed states %r; others=%s own=%s'
                       % (key, fp, outcome, code, json.dumps(body), cands, others, own))

    def undo_to_savepoint(s, t1):
        txn = s.txn
        lvl = len(txn['sp'])
        # actions done at this savepoint level or deeper are undone
        txn['actions'] = [a for a in txn['actions'] if a.get('sp_level', 0) < lvl]
        # locks taken after the savepoint are released: end them for the lock model
        sc.lockers = [(ls, lk, lt, ltx) if not (ls is s and lt >= txn['sp_t'][-1] and ltx is txn) else (ls, lk, lt, {'end': t1})
                      for (ls, lk, lt, ltx) in sc.lockers]

    async def end_txn(s, how):
        txn = s.txn
        t0 = time.time()
        if how == 'ROLLBACK TO':
            name = txn['sp'][-1]
            try:
                await stmt(s, 'ROLLBACK TO SAVEPOINT ' + name)
            except psycopg.Error as e:
                sc.violate('rollback to failed: %s' % e)
            t1 = time.time()
            undo_to_savepoint(s, t1)
            txn['failed'] = False
            sc.log(s, 'ROLLBACK TO', name)
            return
        xid = None
        if how == 'COMMIT' and not txn['failed'] and txn['actions']:
            try:
                xid = (await stmt(s, 'SELECT pg_current_xact_id()::text'))[0][0]
            except psycopg.Error as e:
                sc.violate('xid: %s' % e)
            t0 = time.time()
        if txn.get('end_start') is None:
            txn['end_start'] = t0
        try:
            await stmt(s, how)
            t1 = time.time()
            ok = True
        except psycopg.Error as e:
            t1 = time.time()
            ok = False
            sc.violate('%s failed: %s %s' % (how, e.sqlstate, e))
        committed = ok and how == 'COMMIT' and not txn['failed']
        sc.log(s, how, '-> committed' if committed else '-> rolled back')
        if committed and txn['actions']:
            sc.commits.append((xid, txn['actions']))
        if txn.get('end') is None:
            txn['end'] = t1
        s.txn = None

    async def session_step(s):
        r = rng.random()
        if s.txn is None:
            if r < 0.45:
                rr = rng.random() < 0.2
                await stmt(s, 'BEGIN ISOLATION LEVEL REPEATABLE READ' if rr else 'BEGIN')
                s.txn = dict(actions=[], sp=[], sp_t=[], failed=False, end=None, end_start=None,
                             rr=rr, begin_t=time.time())
                sc.log(s, 'BEGIN', 'REPEATABLE READ' if rr else '')
            elif r < 0.8:
                await do_key_op(s, 'reserve')
            else:
                await do_key_op(s, rng.choice(['complete', 'complete', 'release', 'checkpoint']))
            return
        if s.txn['failed']:
            if s.txn['sp'] and r < 0.5:
                await end_txn(s, 'ROLLBACK TO')
            else:
                await end_txn(s, 'ROLLBACK')
            return
        if r < 0.35:
            await do_key_op(s, 'reserve')
        elif r < 0.6:
            await do_key_op(s, rng.choice(['complete', 'complete', 'release', 'checkpoint']))
        elif r < 0.68:
            name = 'sp%d' % (len(s.txn['sp']) + 1)
            await stmt(s, 'SAVEPOINT ' + name)
            s.txn['sp'].append(name)
            s.txn['sp_t'].append(time.time())
            # actions after this get sp_level len(sp)
            sc.log(s, 'SAVEPOINT', name)
        elif r < 0.72 and s.txn['sp']:
            await end_txn(s, 'ROLLBACK TO')
        elif r < 0.74 and s.txn['sp']:
            name = s.txn['sp'].pop()
            s.txn['sp_t'].pop()
            await stmt(s, 'RELEASE SAVEPOINT ' + name)
            lvl = len(s.txn['sp'])
            for a in s.txn['actions']:
                if a.get('sp_level', 0) > lvl:
                    a['sp_level'] = lvl
            sc.log(s, 'RELEASE SAVEPOINT', name)
        elif r < 0.9:
            await end_txn(s, 'COMMIT')
        else:
            await end_txn(s, 'ROLLBACK')

    async def admin_step():
        r = rng.random()
        if r < 0.35:
            key = rng.choice([k for k in sc.keys if k[1] == 'fz_fail'] + sc.keys)
            code = rng.choice([200, 201, 404, 500])
            t0 = time.time()
            body = {'resolved': sc.n}
            sc.n += 1
            entry = [None, key, t0, None]
            sc.inflight.append(entry)
            try:
                rows = await (await admin.execute('SELECT idem_resolve(%s, %s, %s, %s, %s::jsonb)::text, pg_current_xact_id_if_assigned()::text',
                                                  (key[0], key[1], key[2], code, json.dumps(body)))).fetchall()
                t1 = time.time()
                status, xid = rows[0]
                stored = status is not None
                sc.count(key, 'completed' if stored else 'released')
                sc.log('ADMIN resolve', key, code, '->', status)
                def chk(key=key, t0=t0, t1=t1):
                    cands = sc.candidates(key, t0, t1)
                    if not any(st.status == 'processing' for st in cands):
                        sc.violate('resolve succeeded on a key not processing: %r' % cands)
                sc.deferred.append(chk)
                sc.commits.append((xid, [dict(kind='resolve', key=key, t0=t0, t1=t1, token=None, code=code, body=body,
                                              headers=None, stored=stored)]))
            except psycopg.Error as e:
                sc.log('ADMIN resolve', key, '-> ERROR', e.sqlstate, str(e).splitlines()[0][:120])
                if e.sqlstate not in ALLOWED['resolve']:
                    sc.violate('undocumented SQLSTATE %s from resolve: %s' % (e.sqlstate, e))
            entry[3] = time.time()
        elif r < 0.6:
            older = rng.choice([None, None, '200 milliseconds', '2 seconds'])
            t0 = time.time()
            try:
                if older:
                    rows = await (await admin.execute('SELECT idem_sweep(%s::interval), pg_current_xact_id_if_assigned()::text', (older,))).fetchall()
                else:
                    rows = await (await admin.execute('SELECT idem_sweep(), pg_current_xact_id_if_assigned()::text')).fetchall()
                t1 = time.time()
                n, sxid = rows[0]
                sc.log('ADMIN sweep', older, '->', n)
                sc.swept = getattr(sc, 'swept', 0) + n
                # flags are read back below (lookup); mark candidates flagged in the model
                thr = LOCK_TIMEOUT if older is None else {'200 milliseconds': 0.2, '2 seconds': 2.0}[older]
                rows = await (await admin.execute(
                    "SELECT tenant_id, scope, idem_key, needs_reconciliation, lock_token::text FROM idempotency.keys"
                    " WHERE tenant_id = ANY(%s) AND status = 'processing'", (sc.tenants,))).fetchall()
                acts = []
                for (tt, ss, kk, flag, tok) in rows:
                    if flag:
                        acts.append(dict(kind='sweep_flag', key=(tt, ss, kk), token=tok, t0=t0, t1=t1, thr=thr))
                if sxid is not None and acts:
                    sc.commits.append((sxid, acts))
            except psycopg.Error as e:
                sc.log('ADMIN sweep -> ERROR', e.sqlstate, e)
                if e.sqlstate not in ALLOWED['sweep']:
                    sc.violate('undocumented SQLSTATE %s from sweep: %s' % (e.sqlstate, e))
        elif r < 0.8:
            # kill a session idle in a transaction
            cands = [s for s in sc.sessions if s.txn is not None and not s.busy]
            if not cands:
                return
            s = rng.choice(cands)
            s.busy = True
            t0 = time.time()
            s.txn['end_start'] = t0
            await admin.execute('SELECT pg_terminate_backend(%s)', (s.pid,))
            for _ in range(200):
                r2 = await (await admin.execute('SELECT count(*) FROM pg_stat_activity WHERE pid = %s', (s.pid,))).fetchone()
                if r2[0] == 0:
                    break
                await asyncio.sleep(0.01)
            t1 = time.time()
            sc.log('ADMIN kill', s, '(txn rolled back)')
            s.txn['end'] = t1
            s.txn = None
            try:
                await s.conn.close()
            except Exception:
                pass
            await s.connect()
            s.busy = False
        else:
            await asyncio.sleep(rng.choice([0.2, 0.5, 0.7]))

    # ------------------------------------------------------------- scheduler
    async def guarded(s):
        s.busy = True
        try:
            await session_step(s)
        except psycopg.OperationalError as e:
            sc.log(s, 'connection error', e)
            if s.txn is not None:
                s.txn['end'] = time.time()
                s.txn = None
            await s.connect()
        finally:
            s.busy = False

    tasks = []
    for i in range(args.ops):
        if rng.random() < 0.12:
            await admin_step()
        else:
            idle = [s for s in sc.sessions if not s.busy]
            if idle:
                s = rng.choice(idle)
                t = asyncio.ensure_future(guarded(s))
                tasks.append(t)
                # let it finish unless it blocks
                try:
                    await asyncio.wait_for(asyncio.shield(t), 0.08)
                except asyncio.TimeoutError:
                    sc.log(s, '... blocked, moving on')
        await asyncio.sleep(rng.random() * 0.05)
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in sc.sessions:
        if s.txn is not None:
            await end_txn(s, 'COMMIT' if rng.random() < 0.5 else 'ROLLBACK')
    # ----------------------------------------------------------- final checks
    xids = [x for (x, _) in sc.commits if x is not None]
    if any(x is None for (x, _) in sc.commits):
        sc.violate('a committed change without a transaction id: %r' % [a for (x, a) in sc.commits if x is None])
    rows = await (await admin.execute(
        'SELECT x, extract(epoch FROM pg_xact_commit_timestamp(x::xid8::text::xid))::float8 FROM unnest(%s::text[]) x',
        (xids,))).fetchall()
    ts = dict(rows)
    for x, acts in sorted(((x, a) for (x, a) in sc.commits if x is not None), key=lambda p: ts[p[0]]):
        commit_actions(acts, ts[x], ts[x])
    for f in sc.deferred:
        f()
    await final_checks(sc, admin)
    for s in sc.sessions:
        await s.conn.close()
    await admin.close()
    return sc


async def final_checks(sc, admin):
    # 1. committed executions == committed 'created'
    rows = await (await admin.execute('SELECT tenant, scope, key, attempt FROM fz_exec WHERE tenant = ANY(%s)',
                                      (sc.tenants,))).fetchall()
    db_att = {r[3]: (r[0], r[1], r[2]) for r in rows}
    if set(db_att) != set(sc.committed_created):
        sc.violate('executions %s vs committed created %s' % (sorted(db_att), sorted(sc.committed_created)))
    # 2. keys table vs model
    rows = await (await admin.execute(
        'SELECT tenant_id, scope, idem_key, status::text, lock_token::text, response_code, response_body, response_headers,'
        ' needs_reconciliation FROM idempotency.keys WHERE tenant_id = ANY(%s)', (sc.tenants,))).fetchall()
    db = {(r[0], r[1], r[2]): r[3:] for r in rows}
    for key in sc.keys:
        st = sc.cur(key)
        d = db.get(key)
        if st.status == 'absent':
            if d is not None:
                sc.violate('final: %s is %r in the table, model says absent' % (key, d))
            continue
        if d is None:
            sc.violate('final: %s missing from the table, model says %r' % (key, st))
            continue
        status, tok, code, body, headers, flag = d
        if status != st.status:
            sc.violate('final: %s status %s, model %r' % (key, status, st))
        elif status == 'processing':
            if tok != st.token:
                sc.violate('final: %s token %s, model %r' % (key, tok, st))
        elif (code, body, headers) != (st.code, st.body, st.headers):
            sc.violate('final: %s response %r, model %r' % (key, d, st))
    # 3. every replay returned the final stored response (no expiry in these schedules)
    for key, reps in sc.replays.items():
        st = sc.cur(key)
        for (code, body, headers, s, t0, t1) in reps:
            if st.status not in ('succeeded', 'failed') or (code, body, headers) != (st.code, st.body, st.headers):
                sc.violate('replay of %s gave %s %s, final state %r' % (key, code, json.dumps(body), st))
    # 4. stats
    rows = await (await admin.execute(
        'SELECT tenant, scope, created, replayed, in_progress, mismatched, stale, completed, released, swept'
        ' FROM idempotency.stats WHERE tenant = ANY(%s)', (sc.tenants,))).fetchall()
    names = ['created', 'replayed', 'in_progress', 'mismatched', 'stale', 'completed', 'released', 'swept']
    got = {(r[0], r[1]): dict(zip(names, r[2:])) for r in rows}
    swept_total = 0
    for pair in set(got) | set(sc.counts):
        g = got.get(pair, {})
        e = sc.counts.get(pair, {})
        swept_total += g.get('swept', 0) or 0
        for n in names[:-1]:
            if (g.get(n, 0) or 0) != e.get(n, 0):
                sc.violate('stats %s %s: view %s, answers %s' % (pair, n, g.get(n, 0), e.get(n, 0)))
    if swept_total != getattr(sc, 'swept', 0):
        sc.log('note: swept in view %s, sweep returned %s (other schedules\' keys may count)' % (swept_total, getattr(sc, 'swept', 0)))
    # leave no unflagged stale keys of this schedule for the next one's sweeps
    await admin.execute("SELECT idem_sweep('1 millisecond')")


async def setup(args):
    c = await psycopg.AsyncConnection.connect(args.dsn, autocommit=True)
    await c.execute('CREATE TABLE IF NOT EXISTS fz_exec (tenant text, scope text, key text, attempt int, token uuid, sess int,'
                    ' PRIMARY KEY (tenant, scope, key, attempt))')
    for s, kind in SCOPES.items():
        await c.execute('SELECT idem_configure_scope(%s, %s::jsonb)',
                        (s, json.dumps({'lock_timeout': '%d milliseconds' % int(LOCK_TIMEOUT * 1000),
                                        'stale_action': kind, 'ttl': '1 hour', **SCOPE_EXTRA.get(s, {})})))
    await c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--dsn', default='')
    ap.add_argument('--seeds', default=None)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--ops', type=int, default=60)
    ap.add_argument('--sessions', type=int, default=4)
    ap.add_argument('--trace', action='store_true')
    ap.add_argument('--verbose', action='store_true')
    args = ap.parse_args()
    if args.seed is not None:
        seeds = [args.seed]
    else:
        a, b = (args.seeds or '1-20').split('-')
        seeds = range(int(a), int(b) + 1)
    asyncio.run(setup(args))
    bad = []
    for seed in seeds:
        sc = asyncio.run(run_schedule(args, seed))
        if sc.violations:
            bad.append(seed)
            print('SEED %d: %d violation(s)' % (seed, len(sc.violations)), flush=True)
            for v in sc.violations:
                print('   ', v)
            if args.verbose and not args.trace:
                print('\n'.join(sc.trace))
        elif args.verbose:
            print('seed %d ok (%d ops)' % (seed, len(sc.trace)), flush=True)
    print('schedules: %d, failing seeds: %s' % (len(seeds), bad))
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
