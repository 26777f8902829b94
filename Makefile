# make run   — set up (if needed) and start the server on 127.0.0.1:8765
# make test  — set up (if needed), lint, type-check and run the whole suite
# make bench — set up (if needed), run every benchmark, write bench/results/DATE.md
# make fuzz  — set up (if needed) and fuzz the API long (tests/fuzz/, Schemathesis)
.PHONY: setup run test lint bench fuzz clean

VENV := .venv
# The programs of the session image that run inside every sandbox (no .py suffix: each is
# checked on its own, as a script).
SANDBOX_PROGRAMS := $(wildcard desktop_image/rootfs/usr/local/bin/deskbox-*)
BIN := $(VENV)/bin

setup:
	@scripts/setup.sh

run: setup
	$(BIN)/deskbox serve

# lint-imports: the layers of pyproject.toml's [tool.importlinter] (deskbox_agent is not
# installed on the host: it is found through PYTHONPATH).
lint: setup
	$(BIN)/ruff check server clients tests bench tasks desktop_image $(SANDBOX_PROGRAMS)
	PYTHONPATH=server:desktop_image/agent $(BIN)/lint-imports
	$(BIN)/mypy
	for program in $(SANDBOX_PROGRAMS); do $(BIN)/mypy --strict $$program || exit 1; done

# The viewer's own logic first (vnc/test/, node's test runner; no npm packages), then pytest
# in two runs: most folders on two workers (each file's tests on one worker, in order),
# then alone the folders that need the host to themselves: the agent's (milliseconds of
# input and settling on a real desktop), the checkpoints' (CRIU dumps and restores whole
# desktops: on the workers they passed twice, and in a third full run a restore on the
# other worker failed, "Cannot apply seals on memfd", not explained; 2026-12-06), Podman's
# containers and pods (they pass beside another worker since each test Podman has its own
# tmpdir, but the whole run then took a minute longer), the faults (fork bombs, memory
# hogs, stalls with deadlines) and the VMs (software-emulated guests take both cores while
# they boot).
ALONE := tests/agent tests/state tests/desktop_image tests/docker tests/kubernetes \
	tests/faults tests/vm

test: lint
	node --test vnc/test/*.test.js
	$(BIN)/pytest -n 2 --dist loadfile $(ALONE:%=--ignore=%)
	$(BIN)/pytest $(ALONE)

# Each script prints markdown tables; bench/report.py runs them in turn and collects the
# tables in bench/results/YYYY-MM-DD.md. `make bench BENCH_ARGS=--quick`: small sizes.
BENCHES := agent_desktop.py api.py vnc.py state.py container_start.py peers.py startup.py density.py \
	load.py agent_protocol.py server_cpu.py agent_live.py exec.py click_layers.py vm.py engines.py rl.py \
	volumes.py recording.py listing.py soak.py settle_busy.py
BENCH_ARGS ?=

bench: setup
	$(BIN)/python bench/report.py $(BENCH_ARGS) $(BENCHES)

# `make test` fuzzes briefly (12 cases per operation); this runs every phase, coverage
# included, with many more. DESKBOX_FUZZ_EXAMPLES=N to change the count.
DESKBOX_FUZZ_EXAMPLES ?= 300

fuzz: setup
	DESKBOX_FUZZ_EXAMPLES=$(DESKBOX_FUZZ_EXAMPLES) \
	DESKBOX_FUZZ_PHASES=examples,coverage,fuzzing,stateful \
	$(BIN)/pytest tests/fuzz -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache bench/.peers
