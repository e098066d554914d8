# The two set-up commands of the README: `make demo` and `make test`. Both create .venv if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test services clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: where a CPU wheel is on disk pip takes it instead of pulling CUDA builds.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/palomino train examples/quickstart.yaml

# What the tests drive (RabbitMQ's and Redis's programs, chromium, ...): installed, never started;
# the integration tests start throwaway servers of their own.
services:
	bash scripts/ensure-services.sh

test: $(VENV)/.installed services
	$(VENV)/bin/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
