#!/usr/bin/python3
"""Count the errors in valgrind's logs (one per process, errors between
VALGRINDERROR-BEGIN and VALGRINDERROR-END): those whose stack passes
through the extension (a frame in a source file of the build directory,
valgrind runs with --fullpath-after=, or in idempotency.so) are the
extension's.  Exit status 1 when there is one, or when a process died of a
signal.

    valgrind-report.py LOGDIR BUILDDIR"""
import os
import re
import sys

logdir = sys.argv[1]
builddir = os.path.realpath(sys.argv[2]) + "/"
errors = []          # (file, text)
deaths = []
processes = 0
for name in sorted(os.listdir(logdir)):
    with open(os.path.join(logdir, name), errors="replace") as fh:
        text = fh.read()
    processes += 1
    errors += [(name, m.group(1)) for m in
               re.finditer(r"VALGRINDERROR-BEGIN\n(.*?)VALGRINDERROR-END", text, re.S)]
    deaths += [(name, l) for l in text.splitlines() if "Process terminating with default action" in l]

ours = [(f, t) for (f, t) in errors if "idempotency.so" in t or builddir in t]
print(f"check-valgrind: {processes} processes, {len(errors)} valgrind errors, "
      f"{len(ours)} in the extension (a stack through its code), {len(deaths)} killed by a signal")
for (f, t) in ours[:10]:
    print(f"======== {f}\n{t}")
for (f, t) in [e for e in errors if e not in ours][:5]:
    print(f"======== not the extension's: {f}\n{t}")
for (f, l) in deaths[:5]:
    print(f"======== {f}: {l}")
sys.exit(1 if ours or deaths else 0)
