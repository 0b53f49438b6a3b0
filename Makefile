# One task runner. `make demo` and `make test` are the README's two commands.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format bench clean

$(STAMP): setup.cfg setup.py
	@# libturbojpeg for the fast JPEG path; without it imgpack falls back to Pillow.
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! ldconfig -p | grep -q libturbojpeg; then \
		(apt-get update -qq && apt-get install -y -qq libturbojpeg0 >/dev/null) \
		|| echo "warning: libturbojpeg0 not installed; JPEG decoding will use Pillow"; fi
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,data]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python scripts/demo.py

test: setup
	$(BIN)/python -m pytest -q

# Benchmarks (minutes; results and method in docs/BENCHMARKS.md).
bench: setup
	$(BIN)/python -m scripts.bench.make_folder --out bench-data/folder --images 3000
	$(BIN)/python -m scripts.bench.convert --repeats 5 --json bench-data/results/convert.json
	$(BIN)/python -m scripts.bench.read --repeats 5 --json bench-data/results/read.json

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out bench-data *.egg-info .pytest_cache .ruff_cache
