# Makefile for the idempotency extension (PGXS)
#
# Plain "make && make install" builds against the PostgreSQL whose pg_config
# is PG_CONFIG (the first on PATH by default), and "make installcheck" tests
# it.  "make demo" and "make test [PG=17|18]" also install what is missing
# on a Debian 12 machine (run them as root); see README.md.

EXTENSION = idempotency
MODULE_big = idempotency
OBJS = idempotency.o fingerprint.o keys.o guard.o execute.o ratelimit.o outbox.o maintenance.o stats.o citus.o
PGFILEDESC = "idempotency - idempotency keys and a transactional outbox"
# SHA-256 through OpenSSL when PostgreSQL is built with it (fingerprint.c)
SHLIB_LINK += $(filter -lcrypto, $(LIBS))

# The version comes from the control file, in this one place.  The current
# version's install script is assembled from one part per module
# (install/*.sql), concatenated in name order; the released scripts of older
# versions and every upgrade step are checked in as they shipped.
EXTVERSION = $(shell sed -n "s/^default_version = '\\(.*\\)'/\\1/p" $(srcdir)/idempotency.control)
DATA_built = idempotency--$(EXTVERSION).sql
DATA = $(filter-out idempotency--$(EXTVERSION).sql,$(wildcard idempotency--*.sql))
INSTALL_PARTS = $(sort $(wildcard $(srcdir)/install/*.sql))

# Every file in sql/ and specs/ is a test, run in name order (00_install
# first: it creates the extension the others use); a new test is a new
# file, with no list to keep in step.
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
# idempotency.conf: what a temporary instance needs (EXTRA_REGRESS_OPTS=
# --temp-instance=DIR); a running server is used as it is configured
REGRESS_OPTS = --load-extension=idempotency --encoding=UTF8 \
	--temp-config=$(srcdir)/idempotency.conf
ISOLATION = $(patsubst specs/%.spec,%,$(sort $(wildcard specs/*.spec)))
ISOLATION_OPTS = --load-extension=idempotency \
	--temp-config=$(srcdir)/idempotency.conf
TAP_TESTS = 1

EXTRA_CLEAN = bench/results

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)

ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
# after PGXS, which resets it: t/lib holds the TAP tests' shared helpers
PROVE_FLAGS += -I t/lib
else
all install installcheck:
	@echo "PGXS not found (PG_CONFIG=$(PG_CONFIG))." >&2
	@echo "Install the server's development files (on Debian: postgresql-server-dev-NN)," >&2
	@echo "pass PG_CONFIG=/path/to/pg_config, or run 'make demo' / 'make test' as root." >&2
	@exit 1
endif

srcdir ?= .

idempotency--$(EXTVERSION).sql: $(INSTALL_PARTS)
	cat $^ > $@

# Set-up and walk-through on a Debian 12 machine (as root).
.PHONY: demo test test-citus crash deps bench fuzz check-valgrind pgindent
deps:
	bash scripts/deps.sh

demo:
	bash scripts/demo.sh

# PG=17 or PG=18 tests that version (scripts/lib.sh); the default is 15
test:
	PG='$(PG)' bash scripts/test.sh

# The extension on a Citus cluster (a coordinator and two workers): an
# installed Citus, or one built from ../shared/vendor/citus-13.2.2.tar.gz
# (CITUS_ARCHIVE=...) and cached; skipped, saying why, with neither.
test-citus:
	bash scripts/test-citus.sh

# The failover test and the crash injection test alone, with more crashes
# (CRASHES=N, default 60) than "make test" injects.
crash:
	bash scripts/crash.sh

bench:
	bash bench/run.sh

# long runs of the fingerprint differential and the input fuzzer (fuzz/)
fuzz:
	bash scripts/fuzz.sh

# the regression and isolation suites against a server under valgrind
check-valgrind:
	bash scripts/check-valgrind.sh

# lay out the C files as PostgreSQL's pgindent does (CHECK=1: only check)
pgindent:
	CHECK='$(CHECK)' bash scripts/pgindent.sh
