# commcamp: the two Quick-start commands (`make demo`, `make test`) do all set-up themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BUILD ?= build
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

# Debian 12 packages: toolchain, both MPIs, Slurm + munge for the local multi-node cluster,
# PostgreSQL for the store tests, Lmod for modulefile tests, hipcc for the HIP compile check,
# Chromium for the report test, clang + its runtime libraries for the tuner plugin's libFuzzer test.
APT_PACKAGES := build-essential cmake pkg-config git python3-venv python3-dev \
	openmpi-bin libopenmpi-dev mpich libmpich-dev hwloc \
	slurm-wlm munge iproute2 procps util-linux \
	postgresql lmod hipcc libamdhip64-dev chromium clang libclang-rt-14-dev

.PHONY: help system-deps venv bench demo test clean

help:
	@echo "make demo   - set everything up, run the smoke campaign on this machine (CPU, SQLite)"
	@echo "make test   - set everything up, run every test"

system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

bench:
	$(MAKE) -C bench_src BUILD_DIR=$(abspath $(BUILD))/bench

demo: system-deps venv
	$(VENV)/bin/commcamp run campaigns/smoke.yaml

test: system-deps venv bench
	$(PY) -m pytest -ra --durations=25 tests

clean:
	rm -rf $(BUILD)
