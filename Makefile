# make run   — set up (if needed) and start the server on 127.0.0.1:8765
# make test  — set up (if needed), lint, type-check and run the whole suite
# make bench — set up (if needed) and print the benchmark tables
.PHONY: setup run test lint bench clean

VENV := .venv
BIN := $(VENV)/bin

setup:
	@scripts/setup.sh

run: setup
	$(BIN)/deskbox serve

lint: setup
	$(BIN)/ruff check server clients tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: setup
	$(BIN)/python bench/driver.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/vnc.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
