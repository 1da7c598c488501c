# make book : install (first time), execute every notebook and build the HTML book in _build/html
# make test : install, unit tests, Triton kernel via its interpreter, nbval over every notebook,
#             the book build, a headless browser check
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
VENDORED := node_modules/.package-lock.json
BUILD_FLAGS := -W -n --keep-going

.PHONY: install book test unit nbval browser-check execute bench triton-check clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, and only when missing: `pip install torch==2.13.0` takes the CPU wheel on this
# machine, while a bare `torch` requirement would pull a multi-GB CUDA build. An existing torch
# (Colab's, or yours) satisfies `torch>=2.2` and is never upgraded.
$(INSTALLED): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(INSTALLED) $(VENDORED)

# JavaScript for offline figures (book/_ext/offline_js.py). Without npm the book uses the CDNs.
$(VENDORED): package.json package-lock.json
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the built book will load its JavaScript from CDNs"; fi

book: install
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)

# Re-execute the notebooks in place (stored outputs are committed).
# NOTEBOOKS=book/06_transformer.ipynb re-executes just that one.
NOTEBOOKS ?= book/[0-9]*.ipynb
execute: install
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=120 $(NOTEBOOKS)

unit: install
	$(PY) -m pytest -m "not book" tests/

nbval: install
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=120 book/

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser-check: install
	@command -v chromium >/dev/null || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium \
	  || ($(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)
	LECTURE_REQUIRE_BOOK=1 $(PY) -m pytest -m book tests/

# Triton kernel correctness on the CPU through Triton's interpreter (no GPU needed). Triton is
# installed only when missing, so a CUDA torch's own pinned Triton is never replaced.
triton-check: install
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install --quiet triton==3.9.0
	TRITON_INTERPRET=1 $(PY) -m pytest -p no:cacheprovider tests/test_attention_triton.py

test: unit triton-check nbval book browser-check

bench: install
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf _build .pytest_cache
