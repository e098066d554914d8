# The two set-up commands of the README: `make demo` and `make test`. Both create .venv if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test services clean

# The demo needs Palomino alone; the tests add the dev extras (pytest, lint, chart and browser tools,
# TensorBoard's reader) on top of the same .venv.
$(VENV)/.core: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: where a CPU wheel is on disk pip takes it instead of pulling CUDA builds.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.core
	$(VENV)/bin/palomino train examples/quickstart.yaml

# What the tests drive (RabbitMQ's and Redis's programs, chromium, ...): installed, never started;
# the integration tests start throwaway servers of their own.
services:
	bash scripts/ensure-services.sh

# Tests that need MNIST take it from $PALOMINO_DATA_DIR/mnist (they skip without it, and fail under
# CI). Where the variable is unset and ../shared/datasets/mnist exists (the test split some
# development machines keep beside the repository), the tests use that.
test: $(VENV)/.installed services
	if [ -z "$${PALOMINO_DATA_DIR:-}" ] && [ -d ../shared/datasets/mnist ]; then \
		PALOMINO_DATA_DIR=$$(cd ../shared/datasets && pwd); export PALOMINO_DATA_DIR; \
	fi; \
	$(VENV)/bin/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
