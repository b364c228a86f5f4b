# Everything a fresh machine needs: `make demo` and `make test` install first.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test demo lint chromium clean

# --no-compile: Python compiles a module when it is first imported, so the install does not compile the
# thousands that are never imported (torch's alone cost about 16 s of CPU). That needs Python to keep what it
# compiled: with PYTHONDONTWRITEBYTECODE set (some CI images and shells set it) every process, every test's
# subprocess and worker, compiled its imports again (pandas alone: 1.5 CPU-seconds a process). Unset here.
# AReaL and verl, for the tests that run their code, go in with --no-deps: their own pins pull CUDA torch.
# verl's wheel also installs its own test suite and scripts as top-level `tests` and `scripts` packages,
# which would shadow this repository's `tests` (`from tests.builders import ...`): they are removed.
$(STAMP): pyproject.toml Makefile requirements-trainers.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile $(TORCH) 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	$(BIN)/pip install --quiet --no-compile -e '.[train,dev,export,ray,scale]' '$(TORCH)' 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	$(BIN)/pip install --quiet --no-compile --no-deps -r requirements-trainers.txt 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	rm -rf "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/{tests,scripts}
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the real-browser tests (never `playwright install`).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing and not root: browser tests will be skipped" >&2; fi; }

test: install chromium
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

demo: install
	$(BIN)/proxaudit demo

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info demo-out
