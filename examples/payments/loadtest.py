#!/usr/bin/python3
"""Concurrent retrying clients for the example payments service.

For each of --keys idempotency keys, --clients threads send the same charge
--repeats times with random delays, retrying 409 / 503 / connection errors
with the same key until they get a final answer (bounded by --deadline);
outages are retried with exponential backoff.
After its first final answer a client also sends, with --mismatch-rate
probability, the same key with a changed amount, which must be refused with
422.  Keys alternate between two tenants, and the same key string is used
by both, so tenants must not see each other's answers.

Prints one JSON summary on stdout: for every (tenant, key) the distinct
final answers (status, body, headers minus Date) and the statuses of the
changed-body requests; plus counts per status.  The caller checks them.

--spread S starts the keys at random moments over S seconds instead of all
at once, to keep a steady load running while the database is crashed or
fails over.  --ack-log FILE appends one JSON line per answer the service
acknowledged (2xx), as soon as it arrives: {"tenant", "key", "request",
"status", "body", "replayed"}.  What was acknowledged is known even if this
client is killed, and must survive whatever happens to the database.

--compare-pipeline DSN measures instead what pipelining buys: it starts the
provider and two copies of service.py on DSN (a role granted
idempotency_app, as roles.sql makes payments_service), one pipelined (2
round trips to the database per new charge) and one with
PAYMENTS_PIPELINE=0 (7), and sends each --requests new charges from
--clients keep-alive clients, in --rounds rounds alternating which copy goes
first; it prints requests per second and p50 / p99 latency of each, and the
ratios.  Both copies run in the same conditions, on the same machine, in
the same run: only the ratios mean much.  --db-delay-ms D puts the database
D milliseconds away: the services connect through a relay in this process
that holds each answer of the server for D ms (as a network would), so
that the cost of a round trip is what it is between machines rather than
on loopback.
"""

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

TOKENS = {"acme": "tok_acme", "globex": "tok_globex"}


def post(url, tenant, key, body, timeout=10):
    req = urllib.request.Request(
        url + "/v1/charges", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + TOKENS[tenant],
                 "Idempotency-Key": key})
    # header names are case-insensitive: they are kept as Retry-After,
    # Idempotent-Replayed, ... whatever case the server sent
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.title(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.title(): v for k, v in e.headers.items()}, e.read()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_up(url, proc):
    for _ in range(100):
        if proc.poll() is not None:
            sys.exit("loadtest: %s exited (status %d)" % (url, proc.returncode))
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    sys.exit("loadtest: %s did not come up" % url)


def percentile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p / 100.0 * len(sorted_values)))]


def bench_phase(port, clients, requests, prefix):
    """requests new charges from clients keep-alive connections; return
    (seconds, latencies)."""
    latencies = []
    failures = []
    lock = threading.Lock()
    per_client = requests // clients

    def client(c):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        for i in range(per_client):
            tenant = "acme" if (c + i) % 2 == 0 else "globex"
            body = ('{"amount": %d.%02d, "currency": "EUR", "customer": "cus_%d"}'
                    % (1 + i % 500, i % 100, i % 50))
            t0 = time.perf_counter()
            conn.request("POST", "/v1/charges", body=body, headers={
                "Content-Type": "application/json",
                "Authorization": "Bearer " + TOKENS[tenant],
                "Idempotency-Key": "%s-%d-%d" % (prefix, c, i)})
            resp = conn.getresponse()
            resp.read()
            mine.append(time.perf_counter() - t0)
            if resp.status != 201:
                with lock:
                    failures.append(resp.status)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begin
    if failures:
        sys.exit("loadtest: %d requests were not answered 201 (%s)"
                 % (len(failures), sorted(set(failures))))
    return elapsed, latencies


def delay_relay(dsn, delay):
    """Start a relay that holds every answer of the server named by dsn for
    delay seconds; return the dsn that goes through it."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    params = conninfo_to_dict(dsn)
    host = params.get("host") or os.environ.get("PGHOST") or "/var/run/postgresql"
    port = int(params.get("port") or os.environ.get("PGPORT") or 5432)
    if host.startswith("/"):
        target = (socket.AF_UNIX, "%s/.s.PGSQL.%d" % (host, port))
    else:
        target = (socket.AF_INET, (host, port))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def pump(src, dst, hold):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if hold:
                    time.sleep(hold)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept():
        while True:
            client, _ = listener.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = socket.socket(target[0], socket.SOCK_STREAM)
            server.connect(target[1])
            if target[0] == socket.AF_INET:
                # as libpq does: a pipeline's small writes go out at once
                server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(client, server, 0), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, delay), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    params.update(host="127.0.0.1", port=str(listener.getsockname()[1]),
                  sslmode="disable", gssencmode="disable")
    return make_conninfo(**params)


def compare_pipeline(args):
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    dsn = args.compare_pipeline
    if args.db_delay_ms:
        dsn = delay_relay(dsn, args.db_delay_ms / 1000.0)
    try:
        provider_port = free_port()
        provider = subprocess.Popen(
            [sys.executable, os.path.join(here, "provider.py")],
            env=dict(os.environ, PROVIDER_PORT=str(provider_port)))
        procs.append(provider)
        wait_up("http://127.0.0.1:%d/_ledger" % provider_port, provider)
        ports = {}
        for mode, flag in (("pipelined", "1"), ("unpipelined", "0")):
            ports[mode] = free_port()
            svc = subprocess.Popen(
                [sys.executable, os.path.join(here, "service.py")],
                env=dict(os.environ, PAYMENTS_DSN=dsn,
                         PAYMENTS_PORT=str(ports[mode]), PAYMENTS_PIPELINE=flag,
                         PAYMENTS_POOL_SIZE=str(args.clients),
                         PROVIDER_URL="http://127.0.0.1:%d" % provider_port))
            procs.append(svc)
            wait_up("http://127.0.0.1:%d/healthz" % ports[mode], svc)
        run = "%s-%d" % (args.prefix, int(time.time()))
        # warm up: connections opened, statements prepared
        for mode in ports:
            bench_phase(ports[mode], args.clients, max(args.clients, 20 * args.clients),
                        "%s-warm-%s" % (run, mode))
        total = {mode: [0.0, []] for mode in ports}
        per_round = args.requests // args.rounds
        order = ["pipelined", "unpipelined"]
        for r in range(args.rounds):
            for mode in (order if r % 2 == 0 else order[::-1]):
                elapsed, lat = bench_phase(ports[mode], args.clients, per_round,
                                           "%s-%s-%d" % (run, mode, r))
                total[mode][0] += elapsed
                total[mode][1].extend(lat)
        result = {}
        for mode, (elapsed, lat) in total.items():
            lat.sort()
            result[mode] = {"requests": len(lat), "rps": len(lat) / elapsed,
                            "p50_ms": 1000 * percentile(lat, 50),
                            "p99_ms": 1000 * percentile(lat, 99)}
        print("payments loadtest: %d clients, %d new charges per side in %d rounds"
              " (alternating which side goes first), pool of %d connections, %s"
              % (args.clients, result["pipelined"]["requests"], args.rounds, args.clients,
                 "database %g ms away" % args.db_delay_ms if args.db_delay_ms
                 else "database on the same machine"))
        print("%-34s %12s %9s %9s" % ("", "requests/s", "p50 ms", "p99 ms"))
        for mode, label in (("pipelined", "pipelined (2 round trips)"),
                            ("unpipelined", "PAYMENTS_PIPELINE=0 (7 round trips)")):
            m = result[mode]
            print("%-34s %12.0f %9.2f %9.2f" % (label, m["rps"], m["p50_ms"], m["p99_ms"]))
        p, u = result["pipelined"], result["unpipelined"]
        print("pipelined / unpipelined: requests/s %.2fx, p50 %.2fx, p99 %.2fx"
              % (p["rps"] / u["rps"], p["p50_ms"] / u["p50_ms"], p["p99_ms"] / u["p99_ms"]))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--compare-pipeline", metavar="DSN")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--db-delay-ms", type=float, default=0)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mismatch-rate", type=float, default=0.2)
    ap.add_argument("--max-delay", type=float, default=0.05)
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--prefix", default="k")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--spread", type=float, default=0)
    ap.add_argument("--ack-log")
    args = ap.parse_args()
    if args.compare_pipeline:
        compare_pipeline(args)
        return
    if not args.url:
        ap.error("--url or --compare-pipeline is required")
    ack_log = open(args.ack_log, "a", buffering=1) if args.ack_log else None

    rng = random.Random(args.seed)
    end = time.time() + args.deadline
    lock = threading.Lock()
    results = {}      # "tenant/key" -> {"final": set, "changed": [], "retries": n}
    status_counts = {}
    errors = []

    def record(name, status):
        with lock:
            status_counts[name] = status_counts.get(name, 0) + 1

    def final_answer(tenant, key, body, seed):
        """Send until a final answer; return (status, headers, body) or None.

        A 409 (in progress) is retried after a short random delay; an outage
        (503, no connection) with exponential backoff and jitter, up to 2
        seconds, so that a crowd of clients does not hammer a recovering
        service."""
        r = random.Random(seed)
        failures = 0
        while time.time() < end:
            try:
                status, headers, raw = post(args.url, tenant, key, body)
            except (urllib.error.URLError, OSError) as e:
                record("connection-error", 0)
                failures += 1
                time.sleep(min(2.0, 0.05 * 2 ** failures * (0.5 + r.random())))
                continue
            record(str(status), status)
            if status in (409, 503):
                if "Retry-After" not in headers:
                    with lock:
                        errors.append("%s %s/%s without Retry-After" % (status, tenant, key))
                delay = min(float(headers.get("Retry-After", "1")), 0.5) * r.random() + 0.05
                if status == 503:
                    failures += 1
                    delay = max(delay, min(2.0, 0.05 * 2 ** failures * (0.5 + r.random())))
                time.sleep(delay)
                continue
            return status, headers, raw
        with lock:
            errors.append("no final answer for %s/%s before the deadline" % (tenant, key))
        return None

    def acknowledged(tenant, key, request, status, headers, raw):
        if ack_log is None or not 200 <= status < 300:
            return
        line = json.dumps({"tenant": tenant, "key": key, "request": request,
                           "status": status, "body": raw.decode(),
                           "replayed": headers.get("Idempotent-Replayed") == "true"},
                          sort_keys=True)
        with lock:
            ack_log.write(line + "\n")

    def client(tenant, key, body, seed, start_at):
        r = random.Random(seed)
        entry = results["%s/%s" % (tenant, key)]
        got_final = False
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(args.repeats):
            time.sleep(r.random() * args.max_delay)
            ans = final_answer(tenant, key, body, r.random())
            if ans is None:
                return
            status, headers, raw = ans
            acknowledged(tenant, key, body, status, headers, raw)
            replayed = headers.get("Idempotent-Replayed") == "true"
            kept = {k: v for k, v in headers.items()
                    if k in ("Content-Type", "Location")}
            with lock:
                entry["final"].add(json.dumps([status, kept, raw.decode()], sort_keys=True))
                entry["replayed"] += int(replayed)
            got_final = True
            if got_final and r.random() < args.mismatch_rate:
                changed = dict(body, amount=body["amount"] + 1)
                ans = final_answer(tenant, key, changed, r.random())
                if ans is not None:
                    with lock:
                        entry["changed"].append(ans[0])

    threads = []
    begin = time.time()
    for k in range(args.keys):
        tenant = "acme" if k % 2 == 0 else "globex"
        # the same key string is used by both tenants every other key
        key = ("%s-%d" % (args.prefix, k // 2)) if k % 4 < 2 else ("%s-x%d" % (args.prefix, k))
        body = {"amount": rng.randint(100, 50000) / 100,
                "currency": rng.choice(["EUR", "USD"]),
                "customer": "cus_%d" % rng.randint(1, 50)}
        results["%s/%s" % (tenant, key)] = {"final": set(), "changed": [],
                                             "replayed": 0, "body": body}
        start_at = begin + (rng.random() * args.spread if args.spread else 0)
        for c in range(args.clients):
            threads.append(threading.Thread(
                target=client, args=(tenant, key, body, rng.random(), start_at),
                daemon=True))
    rng.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, end - time.time()) + 15)

    out = {"keys": {name: {"final": sorted(e["final"]), "changed": e["changed"],
                           "replayed": e["replayed"], "body": e["body"]}
                    for name, e in results.items()},
           "statuses": status_counts, "errors": errors}
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
