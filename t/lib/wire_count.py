#!/usr/bin/python3
"""A TCP proxy in front of a PostgreSQL server that counts the messages
clients send, by type, for the TAP tests.

Usage: wire_count.py LISTEN_PORT SERVER_SOCKET COUNTS_FILE

Listens on 127.0.0.1:LISTEN_PORT, forwards every connection to the
server's Unix socket SERVER_SOCKET (for example /tmp/xyz/.s.PGSQL.5432),
and, before it forwards each batch of client bytes, rewrites COUNTS_FILE
with the totals over all connections, as JSON: {"S": syncs, "H": flushes,
"Q": simple queries, "E": executes, "P": parses, ...}.

The server answers only when it is asked to: at a Sync (S), a Flush (H) or
a simple Query (Q).  So a client cannot have waited for the server more
times than it sent one of those: S + H + Q bounds the round trips, and
E + Q counts the statements.  Clients must connect with sslmode=disable
(the bytes are read in clear).
"""

import json
import os
import socket
import struct
import sys
import threading

listen_port, server_socket, counts_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = threading.Lock()
counts = {}


def save():
    tmp = counts_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(counts, f, sort_keys=True)
    os.rename(tmp, counts_file)


def client_to_server(client, server):
    buf = b""
    started = False     # past the untyped start-up messages
    try:
        while True:
            data = client.recv(65536)
            if not data:
                break
            buf += data
            seen = {}
            while True:
                if not started:
                    if len(buf) < 8:
                        break
                    length, code = struct.unpack("!ii", buf[:8])
                    if len(buf) < length:
                        break
                    buf = buf[length:]
                    # SSLRequest, GSSENCRequest and CancelRequest come
                    # before (or instead of) the StartupMessage
                    if code not in (80877103, 80877104, 80877102):
                        started = True
                    continue
                if len(buf) < 5:
                    break
                kind = chr(buf[0])
                (length,) = struct.unpack("!i", buf[1:5])
                if len(buf) < 1 + length:
                    break
                buf = buf[1 + length:]
                seen[kind] = seen.get(kind, 0) + 1
            # counted before the bytes go on: by the time the server has
            # answered them (and the client could read the counts), they
            # are in the file
            if seen:
                with lock:
                    for k, n in seen.items():
                        counts[k] = counts.get(k, 0) + n
                    save()
            server.sendall(data)
    except OSError:
        pass
    finally:
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def server_to_client(server, client):
    try:
        while True:
            data = server.recv(65536)
            if not data:
                break
            client.sendall(data)
    except OSError:
        pass
    finally:
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    with lock:
        save()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", listen_port))
    ls.listen(64)
    while True:
        client, _ = ls.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.connect(server_socket)
        except OSError:
            client.close()
            continue
        threading.Thread(target=client_to_server, args=(client, server), daemon=True).start()
        threading.Thread(target=server_to_client, args=(server, client), daemon=True).start()


if __name__ == "__main__":
    main()
