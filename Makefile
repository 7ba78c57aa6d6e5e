# Two commands do everything on a fresh machine (Python >= 3.11 with pip, a Rust toolchain):
#   make demo   builds the package into .venv and runs the replay-buffer demo
#   make test   builds the package into .venv and runs every test (Rust and Python)
# `make lint` runs the linters CI runs (the layer check included), `make docs` builds docs/ with
# MkDocs (warnings as errors), `make bench` the benchmarks against tensordict.
# `make test-forkserver` runs the sharing tests with forkserver as the default start method
# (Python 3.14's on Linux); `make wheels` builds the release wheel and runs the smoke suite in
# fresh environments of every Python 3.11-3.13 the machine has (.ci/wheels).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SOURCES := pyproject.toml Cargo.toml $(shell find rust -name '*.rs')

.PHONY: demo test test-forkserver wheels lint docs bench clean

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tensordict_rs.demo $(ARGS)

test: $(STAMP)
	cargo test --quiet
	$(PY) -m pytest -q

test-forkserver: $(STAMP)
	TDRS_START_METHOD=forkserver $(PY) -m pytest -q tests/share

wheels:
	PYTHON=$(PYTHON) .ci/wheels

lint: $(STAMP)
	cargo fmt --check
	cargo clippy --quiet --all-targets -- -D warnings
	$(PY) -m ruff check python tests benches
	$(PY) -m ruff format --check python tests benches
	$(PY) -m mypy.stubtest tensordict_rs._native
	$(PY) -m mypy python/tensordict_rs
	$(PY) -m mypy --strict --follow-imports=silent tests/core/typing_usage.py
	$(PY) -m ruff check tools
	$(PY) -m ruff format --check tools
	$(PY) -m mypy --strict tools/check_layers.py
	$(PY) tools/check_layers.py

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

bench: $(STAMP)
	$(PY) benches/report.py $(ARGS)

clean:
	rm -rf $(VENV) target
