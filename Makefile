# The two commands a new user needs: `make demo` and `make test`. Both bootstrap the
# project virtualenv (.venv) themselves and are idempotent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test model serve clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Train both demo classifiers and the tokenizer from scratch (needs torch, CPU build).
model: $(STAMP)
	$(PY) -m pip install --quiet -e ".[test,train]"
	$(PY) -m orchestrator.train

demo: $(STAMP)
	$(PY) -m orchestrator.demo

test: $(STAMP)
	$(PY) -m pytest -q

serve: $(STAMP)
	$(VENV)/bin/orchestrator serve

clean:
	rm -rf $(VENV) .cache .pytest_cache
