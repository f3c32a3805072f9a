# The README's commands. Every target creates .venv when missing and installs
# what it needs; stamps make a second run instant.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: run test lint format typecheck bench bench-compare clean

$(BIN)/python:
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

# Until `ledgerq serve` exists (it replaces this), `make run` migrates the
# default store (ledgerq.sqlite3, or $$LEDGERQ_DB) and prints what it holds.
run: $(VENV)/.run
	$(BIN)/ledgerq migrate
	$(BIN)/ledgerq store summary

test: $(VENV)/.dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(VENV)/.dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(VENV)/.bench
	$(BIN)/ledgerq bench all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
