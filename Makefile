# Two commands do everything on a fresh machine: `make demo` and `make test`.

SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin

# pyenv keeps interpreters out of PATH unless selected; put every installed
# 3.11+ on PATH so both this Makefile and tox find them.
PYENV_ROOT ?= $(HOME)/.pyenv
PYBINS := $(shell ls -d $(PYENV_ROOT)/versions/3.1[1-9].*/bin 2>/dev/null | sort -rV | tr '\n' ':')
export PATH := $(PYBINS)$(PATH)

# The newest Python >= 3.11 on this machine ($(shell) does not see the
# exported PATH, so it gets the interpreter directories itself).
PYTHON ?= $(shell PATH="$(PYBINS)$$PATH"; for v in 3.14 3.13 3.12 3.11; do \
	if command -v python$$v >/dev/null && python$$v -c 'import sys' 2>/dev/null; then command -v python$$v; break; fi; done)

# The tox matrix: each Python x Django pair on each database, every cell at
# once, since the tests mostly wait (on workers, leases, the servers) rather
# than compute. Two cells on one server each have a database of their own,
# and a test that restarts the server waits until it has the server to
# itself (tests/support/serverlock.py).
TOX_PAIRS ?= py311-dj52 py313-dj61
comma := ,
empty :=
space := $(empty) $(empty)
TOX_ENVS := $(foreach pair,$(TOX_PAIRS),$(pair)-sqlite $(pair)-postgresql $(pair)-mariadb)

.PHONY: demo test stress chaos setup sysdeps browser pgbouncer lint docs package clean bench screenshots

# The demo needs only the core (Django and croniter): no database driver,
# no system package, no dev or docs tools.
demo: $(VENV)/.core
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py demo

# Branch coverage comes from the two SQLite cells, which between them run
# every test (tox.ini); its floor sits a point or so under the measured figure.
COVERAGE_FLOOR := 89

test: setup browser pgbouncer
	$(BIN)/coverage erase
	$(BIN)/tox run-parallel --parallel $(words $(TOX_ENVS)) --parallel-no-spinner \
		-e $(subst $(space),$(comma),$(TOX_ENVS))
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report --fail-under=$(COVERAGE_FLOOR)

# The README's pictures of the admin, made by the browser test (SQLite).
screenshots: setup browser
	VELLUM_TEST_DB=sqlite VELLUM_SCREENSHOTS=docs $(BIN)/python -m pytest tests/admin -m browser -q

# The model of the job lifecycle (tests/core/test_state_machine.py) with many
# more examples than `make test` gives it: a few minutes per database.
STRESS_DBS ?= sqlite postgresql

stress: setup
	@set -e; for db in $(STRESS_DBS); do \
		echo "stress: $$db"; \
		VELLUM_HYPOTHESIS_PROFILE=stress VELLUM_TEST_DB=$$db $(BIN)/python -m pytest tests/core/test_state_machine.py; \
	done

# The whole-system randomized test (tests/support/chaos.py) for longer than `make
# test` gives it: CHAOS_SECONDS of faults on each database in turn, about 20
# minutes in all, the figures of each run printed. VELLUM_CHAOS_SEED replays a
# run. Every database is run, and the target fails if any run did.
CHAOS_DBS ?= sqlite postgresql mariadb
CHAOS_SECONDS ?= 360

chaos: setup
	@failed=""; for db in $(CHAOS_DBS); do \
		echo "chaos: $$db, $(CHAOS_SECONDS) s of faults"; \
		VELLUM_CHAOS_SECONDS=$(CHAOS_SECONDS) VELLUM_TEST_DB=$$db \
			$(BIN)/python -m pytest tests/system/test_chaos.py -s -rx -p no:cacheprovider || failed="$$failed $$db"; \
	done; \
	if [ -n "$$failed" ]; then echo "chaos failed on:$$failed"; exit 1; fi

setup: $(VENV)/.installed

# The package alone, as a project installs it.
$(VENV)/.core: pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python >= 3.11 found; install one (e.g. pyenv install 3.13)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $@

# Everything the tests, the linters and the documentation need, installed by
# uv (seconds, where pip takes most of a minute); tox-uv, among the dev tools,
# makes the tox cells' environments with it too.
$(VENV)/.installed: $(VENV)/.core | sysdeps
	$(BIN)/pip install -q uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[postgresql,mysql,dev,docs]'
	touch $@

# Benchmarks run in an environment of their own: Python 3.13, Django 6 and the
# peer queues from PyPI, which the project itself never depends on.
# `make bench BENCH_ARGS=--quick` checks the harness in a few minutes.
BENCH_VENV := .bench-venv
BENCH_PYTHON ?= $(PYENV_ROOT)/versions/3.13.0/bin/python
BENCH_ARGS ?=

bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python -m benchmarks.run $(BENCH_ARGS)

$(BENCH_VENV)/.installed: pyproject.toml benchmarks/requirements.txt | sysdeps
	@test -x "$(BENCH_PYTHON)" || { echo "No $(BENCH_PYTHON); install it (pyenv install 3.13.0) or set BENCH_PYTHON"; exit 1; }
	$(BENCH_PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q -e '.[postgresql,mysql]' -r benchmarks/requirements.txt
	touch $@

# mysqlclient compiles against the MariaDB client headers.
sysdeps:
	@pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null || { \
		echo "Installing the MariaDB client headers (libmariadb-dev) for mysqlclient"; \
		apt-get install -y -q libmariadb-dev pkg-config >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q libmariadb-dev pkg-config >/dev/null; } || { \
			echo "Could not install libmariadb-dev; install it (or your OS's MySQL client headers) and retry"; exit 1; }; }
	@command -v faketime >/dev/null || { \
		echo "Installing libfaketime (faketime) for the tests of workers whose clocks disagree"; \
		apt-get install -y -q faketime >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null; } || { \
			echo "Could not install faketime: the tests of shifted clocks will not run"; \
			test "$$CI" != true; }; }

# tests/worker/test_pgbouncer.py starts a PgBouncer of its own (on a free port, from
# the OS package) in front of the test PostgreSQL. Without the binary that
# module is skipped, except under CI=true, where it fails.
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || { \
		echo "Installing PgBouncer (pgbouncer) for the tests of workers behind a pooler"; \
		apt-get install -y -q pgbouncer >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q pgbouncer >/dev/null; } || { \
			echo "Could not install pgbouncer: tests/worker/test_pgbouncer.py will not run"; \
			test "$$CI" != true; }; }

# The admin's browser test drives Debian's Chromium through its chromedriver.
# Without them that test is skipped, except under CI=true, where it fails.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		echo "Installing Chromium and its driver (chromium, chromium-driver) for the admin's browser test"; \
		apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; } || { \
			echo "Could not install chromium and chromium-driver: the browser test will not run"; \
			test "$$CI" != true; }; }

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check vellum_jobs
	$(BIN)/mypy vellum_jobs tests example_project benchmarks docs/_ext/vellum_reference.py
	$(BIN)/lint-imports
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run
	DJANGO_SETTINGS_MODULE=tests.settings $(BIN)/python -m django makemigrations --check --dry-run

# The documentation site in docs/_build/html, warnings as errors (-n: every
# reference must resolve; -E: every page read again, so an old page's
# warning is not skipped), built with this venv's Python and, through tox,
# with Python 3.11 (and so Django 5.2). Without a python3.11 that second
# build is skipped, except under CI=true, where it fails.
docs: setup
	$(BIN)/sphinx-build -W --keep-going -n -E -b html docs docs/_build/html
	@if command -v python3.11 >/dev/null && python3.11 -c 'import sys' 2>/dev/null; then \
		$(BIN)/tox run -q -e docs; \
	else \
		echo "No python3.11: the documentation was not built with Python 3.11"; \
		test "$$CI" != true; \
	fi

package: setup
	rm -rf dist
	$(BIN)/python -m build -q --installer uv
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) $(BENCH_VENV) .tox .test-dbs dist build *.egg-info example_project/db.sqlite3* docs/_build \
		.grimp_cache .import_linter_cache
