# Two commands for a learner: `make lab` and `make test`. Everything lives in .venv/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fusionlab-installed
PORT   ?= 8888
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=900

.PHONY: env lab test test-unit test-notebooks notebooks bench bench-exports corpus corpus-survey clean

env: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "fusionlab needs Python 3.10 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## make lab: JupyterLab on notebooks/, bound to 127.0.0.1 (headless-safe: prints its URL).
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) \
		--ServerApp.root_dir=notebooks $(if $(DISPLAY),,--no-browser) \
		$(if $(filter 0,$(shell id -u)),--allow-root)

## make test: unit tests and strict nbval over every notebook.
test: $(STAMP)
	$(PY) -m pytest -q tests notebooks $(NBVAL)

test-unit: $(STAMP)
	$(PY) -m pytest -q tests

test-notebooks: $(STAMP)
	$(PY) -m pytest -q notebooks $(NBVAL)

## make notebooks: rebuild notebooks/*.ipynb from notebooks/src/*.py and execute them.
notebooks: $(STAMP)
	$(PY) tools/nbbuild.py notebooks/src/*.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) benchmarks/run_all.py
	$(PY) benchmarks/update_readme.py

## make corpus: re-export tests/corpus/ (torch, transformers, ultralytics in their own .corpus-venv/, ~6 GB),
## then rewrite docs/corpus.md from it (make corpus-survey does only the latter).
corpus: $(STAMP)
	$(PYTHON) tools/export_corpus.py
	$(PY) tools/corpus_survey.py

corpus-survey: $(STAMP)
	$(PY) tools/corpus_survey.py

## make bench-exports: benchmarks/bench_exports.py on full-size exports (made once into .cache/corpus-full/ by
## tools/export_corpus.py --full, ~4.5 GB); results in benchmarks/results/exports.md and the README.
FULL_EXPORTS := .cache/corpus-full
bench-exports: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@test -f $(FULL_EXPORTS)/manifest.json || $(PYTHON) tools/export_corpus.py --full $(FULL_EXPORTS)
	$(PY) benchmarks/bench_exports.py --full-dir $(FULL_EXPORTS)
	$(PY) benchmarks/update_readme.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .cache
