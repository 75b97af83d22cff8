# Two commands for a learner: `make lab` and `make test`. Everything lives in .venv/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fusionlab-installed
PORT   ?= 8888
# Jupyter, IPython, matplotlib and onnxruntime keep their files in the project (never in your home): tools/lab.py sets the
# same variables for the lab it starts; tests/test_lab.py keeps the two lists in agreement.
JSTATE := $(CURDIR)/$(VENV)/jupyter
export JUPYTER_CONFIG_DIR := $(JSTATE)/config
export JUPYTER_DATA_DIR := $(JSTATE)/data
export JUPYTER_RUNTIME_DIR := $(JSTATE)/runtime
export JUPYTERLAB_SETTINGS_DIR := $(JSTATE)/lab/user-settings
export JUPYTERLAB_WORKSPACES_DIR := $(JSTATE)/lab/workspaces
export IPYTHONDIR := $(JSTATE)/ipython
export MPLCONFIGDIR := $(JSTATE)/matplotlib
export NPM_CONFIG_CACHE := $(JSTATE)/npm
export XDG_CACHE_HOME := $(JSTATE)/cache
export JUPYTER_CONFIG_PATH := $(CURDIR)/jupyter
export JUPYTER_PLATFORM_DIRS := 1
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=900

.PHONY: env lab lab-reset check test test-unit test-notebooks test-browser browser-deps notebooks notebook bench bench-exports bench-new-exports bench-reference corpus corpus-survey fuzz clean

env: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "fusionlab needs Python 3.10 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## make lab: JupyterLab on your working copy my-notebooks/ (git-ignored; made from notebooks/ on the first run,
## kept after), bound to 127.0.0.1, opening 00_start_here (prints its URL).
lab: $(STAMP)
	$(PY) tools/lab.py --port $(PORT)

## make lab-reset: copy the stored notebooks/ over my-notebooks/ again (your outputs and edits there go).
lab-reset: $(STAMP)
	$(PY) tools/lab.py --reset

## make check: the contributor's loop (under 2 min): the unit tests without those marked slow (pyproject.toml: the
## corpora, the fuzz CI budget, the tests of seconds), without the browser and without nbval.
check: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests --ignore=tests/browser -m "not slow"

## make test: unit tests, the browser test (installs Debian's chromium once) and strict nbval over every notebook, on
## both cores (pytest-xdist; a file, so a notebook, stays on one worker).
test: $(STAMP) browser-deps
	$(PY) -m pytest -q -n 2 --dist loadfile tests notebooks $(NBVAL)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests --ignore=tests/browser

test-notebooks: $(STAMP)
	$(PY) -m pytest -q notebooks $(NBVAL)

## make test-browser: JupyterLab in headless Chromium: every notebook opened and saved unchanged, the widget and
## netron notebooks (08, 03) Run All, an exercise answered in 11 (nbval runs every notebook), the explorer driven by input, the report page.
test-browser: $(STAMP) browser-deps
	$(PY) -m pytest -q tests/browser

## make browser-deps: Debian's chromium and chromium-driver via apt-get (does nothing when installed).
browser-deps:
	@tools/browser_deps.sh

## make notebooks: rebuild notebooks/*.ipynb from notebooks_src/*.py and execute them.
notebooks: $(STAMP)
	$(PY) tools/nbbuild.py notebooks_src/*.py

## make notebook NB=08_fusion_thresholds: rebuild and execute one notebook.
notebook: $(STAMP)
	$(PY) tools/nbbuild.py $(addprefix notebooks_src/,$(addsuffix .py,$(NB)))

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench,oracle]'
	$(PY) benchmarks/run_all.py
	$(PY) benchmarks/update_docs.py

## make fuzz N=30000 SEED=0: a differential fuzzing campaign over the passes (docs/fuzz.md); resumable.
N     ?= 1000
SEED  ?= 0
FUZZ_OUT ?= fuzz-out/seed$(SEED)
fuzz: $(STAMP)
	$(PY) -m fusionlab.fuzz --n $(N) --seed $(SEED) --out $(FUZZ_OUT)

## make corpus: re-export tests/corpus/ (torch, transformers, ultralytics in their own .corpus-venv/, ~6 GB),
## then rewrite docs/corpus.md from it (make corpus-survey does only the latter).
corpus: $(STAMP)
	$(PYTHON) tools/export_corpus.py
	$(PY) tools/corpus_survey.py

corpus-survey: $(STAMP)
	$(PY) tools/corpus_survey.py

## make bench-exports: benchmarks/bench_exports.py on full-size exports (made once into .cache/corpus-full/ by
## tools/export_corpus.py --full, ~4.5 GB); results in benchmarks/results/exports.md and docs/benchmarks.md.
FULL_EXPORTS := .cache/corpus-full
bench-exports: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@test -f $(FULL_EXPORTS)/manifest.json || $(PYTHON) tools/export_corpus.py --full $(FULL_EXPORTS)
	$(PY) benchmarks/bench_exports.py --full-dir $(FULL_EXPORTS)
	$(PY) benchmarks/update_docs.py

## make bench-new-exports: the same benchmark on the small exports issue 19 added to tests/corpus/ (LLaMA, T5,
## Whisper, Swin, float16 ResNet and BERTs), in .bench-venv/; benchmarks/results/new_exports.md.
NEW_EXPORTS := llama t5_encoder whisper_encoder swin resnet_fp16 bert_fp16 bert_eager_fp16
bench-new-exports: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/bench_exports.py --full-dir tests/corpus --only $(NEW_EXPORTS) \
	  --tools "fusionlab vertical" "onnxscript optimize_for_ort" "onnxruntime transformers optimizer" \
	  --out new_exports --title "The exports issue 19 added (small configs): fusionlab, onnxscript and onnxruntime's transformers optimizer"

## make bench-reference: what onnxscript's optimize_for_ort, onnxruntime's transformers optimizer and ORT EXTENDED
## find on the exports issue 19 added, beside fusionlab's passes (counts, no timing), in its own .bench-venv/ (the
## `bench` extra) so the workbook's .venv stays as it is; benchmarks/results/new_exports_reference.md.
BENCH_VENV := .bench-venv
$(BENCH_VENV)/.installed: pyproject.toml
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]'
	@touch $@
bench-reference: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/new_exports_reference.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .cache
