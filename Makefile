# The README's commands. Every target creates .venv when missing and installs
# what it needs; stamps make a second run instant.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: run test test-fast test-sawtooth-clients lint format bench bench-compare clean protos

$(BIN)/python:
	@PYTHON=$(PYTHON) sh scripts/prerequisites.sh venv
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.run: $(BIN)/python pyproject.toml
	$(PIP) install --quiet -e .
	@touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(PIP) install --quiet -e '.[dev]'
	@touch $@

$(VENV)/.bench: $(VENV)/.dev pyproject.toml
	$(PIP) install --quiet -e '.[dev,bench]'
	@touch $@

# The gateway on the embedded defaults: SQLite file ledgerq.sqlite3 and the
# in-process node, REST API and dashboard on http://127.0.0.1:8080.
run: $(VENV)/.run
	@echo "ledgerq: dashboard at http://127.0.0.1:8080/ (or the --bind given in SERVE_ARGS); from another terminal:"
	@echo "  .venv/bin/ledgerq submit --generate 1000 --services 10"
	$(BIN)/ledgerq serve $(SERVE_ARGS)

# Every test. PostgreSQL is a throwaway cluster the run starts from the
# installed server binaries (or the server LEDGERQ_TEST_PG names); what is
# missing is installed when possible (root on Debian), else named in one line.
test: $(VENV)/.dev
	@sh scripts/prerequisites.sh postgresql chromium
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests that need nothing but Python: unit and interop, slow ones left out.
test-fast: $(VENV)/.dev
	$(BIN)/python -m pytest tests/unit tests/interop -m 'not slow' -q $(PYTEST_ARGS)

# Sawtooth's own CLIs (sawtooth, sawset, intkey) against ledgerq. They are on
# no package index: SAWTOOTH_CLIENTS is where they are built, from checkouts
# of sawtooth-core and sawtooth-sdk-python named by SAWTOOTH_CORE and
# SAWTOOTH_SDK_PYTHON when it holds none yet.
SAWTOOTH_CLIENTS ?= .sawtooth-clients
test-sawtooth-clients: $(VENV)/.dev
	@if [ ! -x "$(SAWTOOTH_CLIENTS)/bin/intkey" ] && [ -n "$(SAWTOOTH_CORE)$(SAWTOOTH_SDK_PYTHON)" ]; then \
		sh scripts/sawtooth-clients.sh "$(SAWTOOTH_CORE)" "$(SAWTOOTH_SDK_PYTHON)" "$(SAWTOOTH_CLIENTS)"; fi
	SAWTOOTH_CLIENTS=$(abspath $(SAWTOOTH_CLIENTS)) $(BIN)/python -m pytest tests/acceptance/test_sawtooth_own_clients.py $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(VENV)/.dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# wrk drives the load benchmark; Debian's package, installed here rather than in CI.
bench: $(VENV)/.bench
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/ledgerq bench all

# ledgerq and procrastinate side by side on the same node and PostgreSQL.
bench-compare: $(VENV)/.bench
	$(BIN)/ledgerq bench compare

# Regenerate the Sawtooth protobuf modules from the .proto files kept in the
# package; the generated files are committed, so this is only needed when the
# .proto files or the protobuf major version change.
PROTO_DIR := src/ledgerq/codec/proto
PROTO_OUT := src/ledgerq/codec
protos: $(VENV)/.dev
	$(BIN)/python -m grpc_tools.protoc -I$(PROTO_DIR) --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
		$(PROTO_DIR)/batch.proto $(PROTO_DIR)/transaction.proto \
		$(PROTO_DIR)/block.proto $(PROTO_DIR)/settings.proto
	sed -i 's/^import transaction_pb2 as /from ledgerq.codec import transaction_pb2 as /' \
		$(PROTO_OUT)/batch_pb2.py $(PROTO_OUT)/batch_pb2.pyi

clean:
	rm -rf $(VENV) .sawtooth-clients .pytest_cache .mypy_cache .ruff_cache .hypothesis
