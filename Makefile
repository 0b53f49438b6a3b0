# One task runner. `make demo` and `make test` are the README's two commands.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test check lint format bench clean asan ubsan

$(STAMP): setup.cfg setup.py tests/constraints.txt $(wildcard readers/images/*.c readers/images/*.h) readers/formats/crc32.c readers/epochs/feistel.c
	@# libturbojpeg for the fast JPEG path (without it imgpack falls back to Pillow), and
	@# libjpeg's headers for the compiled crop kernel (without them crops take the Python path).
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { ! ldconfig -p | grep -q libturbojpeg || [ ! -e /usr/include/jpeglib.h ]; }; then \
		(apt-get update -qq && apt-get install -y -qq libturbojpeg0 libjpeg62-turbo-dev >/dev/null) \
		|| echo "warning: libturbojpeg0/libjpeg62-turbo-dev not installed; JPEG decoding will use Pillow"; fi
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	@# the test extras at the versions the suite last passed with (tests/constraints.txt)
	$(BIN)/pip install -q -c tests/constraints.txt -e '.[test,data]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python scripts/demo.py

# The whole suite on two test processes (pytest-xdist): a test waiting on a server, a timeout
# or a process group overlaps with one that computes. `--dist loadgroup` keeps each module
# that starts a server, Ray or process groups on one worker (tests/conftest.py), and every
# test passes beside another process running tests (free ports, its own tmp_path).
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25  # the slowest tests named
	@# the crop path again without the compiled kernel: the fallback must stay correct too
	IMGPACK_KERNEL=0 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_crop.py \
		tests/test_crop_large.py tests/test_decode.py tests/test_bad_input.py tests/test_read_options.py tests/test_crc.py \
		tests/test_buckets.py tests/test_feistel.py

# The quick tier: everything but loopback servers, Ray, torchrun, fuzzing, wheel builds and
# soak runs (markers in setup.cfg; tests/conftest.py marks the server and cluster fixtures), on
# one test process more than the cores (pytest-xdist): tests wait on their subprocesses and
# workers, and a third process on the 2-core VM fills those waits (CONTRIBUTING). Spawned
# workers start from a forkserver that imported torch once (tests/spawning.py); make test
# spawns them.
QUICK = not (server or cluster or torchrun or fuzz or wheel or slow or soak)
QUICK_PROCESSES = $(shell $(BIN)/python -c "from readers.cpus import usable_cpus; print(usable_cpus() + 1)")
check: setup
	IMGPACK_TEST_SPAWN=forkserver $(BIN)/python -m pytest -q -n $(QUICK_PROCESSES) -m "$(QUICK)"

# Benchmarks (minutes; results and method in docs/BENCHMARKS.md).
bench: setup
	$(BIN)/python -m scripts.bench.make_folder --out bench-data/folder --images 3000
	$(BIN)/python -m scripts.bench.convert --repeats 5 --json bench-data/results/convert.json
	$(BIN)/python -m scripts.bench.read --repeats 5 --json bench-data/results/read.json

# The compiled modules under AddressSanitizer (Python itself is not instrumented: libasan is
# preloaded, leak checks off), then rebuilt as usual.
ASAN_LIB = $(shell gcc -print-file-name=libasan.so)
asan: setup
	CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1" LDFLAGS="-fsanitize=address" \
		$(BIN)/python setup.py -q build_ext --inplace --force --build-temp build/asan
	ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$(ASAN_LIB) \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_kernel.py tests/test_crop.py tests/test_crc.py tests/test_feistel.py; \
		status=$$?; $(BIN)/python setup.py -q build_ext --inplace --force; exit $$status

# The same tests under UndefinedBehaviorSanitizer: any undefined behaviour (overflow, a bad
# shift, a misaligned load) aborts the run; then rebuilt as usual.
UBSAN_LIB = $(shell gcc -print-file-name=libubsan.so)
ubsan: setup
	CFLAGS="-fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1" \
		LDFLAGS="-fsanitize=undefined" \
		$(BIN)/python setup.py -q build_ext --inplace --force --build-temp build/ubsan
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 LD_PRELOAD=$(UBSAN_LIB) \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_kernel.py tests/test_crop.py tests/test_crc.py tests/test_feistel.py; \
		status=$$?; $(BIN)/python setup.py -q build_ext --inplace --force; exit $$status

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out bench-data *.egg-info .pytest_cache .ruff_cache build readers/images/jpegcrop*.so
