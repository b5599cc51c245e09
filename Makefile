# Makefile for the idempotency extension (PGXS)
#
# Plain "make && make install" builds against the PostgreSQL found by
# PG_CONFIG.  "make demo" and "make test" also install what is missing on a
# Debian 12 machine (run them as root); see README.md.

EXTENSION = idempotency
MODULE_big = idempotency
OBJS = idempotency.o fingerprint.o keys.o outbox.o maintenance.o stats.o
PGFILEDESC = "idempotency - idempotency keys and a transactional outbox"

# The version comes from the control file, in this one place.  The current
# version's install script is assembled from one part per module
# (install/*.sql), concatenated in name order; the released scripts of older
# versions and every upgrade step are checked in as they shipped.
EXTVERSION = $(shell sed -n "s/^default_version = '\\(.*\\)'/\\1/p" $(srcdir)/idempotency.control)
DATA_built = idempotency--$(EXTVERSION).sql
DATA = $(filter-out idempotency--$(EXTVERSION).sql,$(wildcard idempotency--*.sql))
INSTALL_PARTS = $(sort $(wildcard $(srcdir)/install/*.sql))

REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=idempotency --encoding=UTF8
ISOLATION = $(patsubst specs/%.spec,%,$(sort $(wildcard specs/*.spec)))
ISOLATION_OPTS = --load-extension=idempotency
TAP_TESTS = 1

EXTRA_CLEAN = bench/results

ifndef PG_CONFIG
PG_CONFIG := $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
endif
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)

ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
# after PGXS, which resets it: t/lib holds the TAP tests' shared helpers
PROVE_FLAGS += -I t/lib
else
all install installcheck:
	@echo "PGXS not found (PG_CONFIG=$(PG_CONFIG))." >&2
	@echo "Install postgresql-server-dev-15, or run 'make demo' / 'make test' as root." >&2
	@exit 1
endif

srcdir ?= .

idempotency--$(EXTVERSION).sql: $(INSTALL_PARTS)
	cat $^ > $@

# Set-up and walk-through on a Debian 12 machine (as root).
.PHONY: demo test deps bench
deps:
	bash scripts/deps.sh

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

bench:
	bash bench/run.sh
