#!/usr/bin/env bash
# Start tritonserver for the orchestrator router (the image's CMD, deploy/Dockerfile).
# Configured by environment variables (set in the Kubernetes manifests under deploy/):
#   MODEL_REPOSITORY    model repository: a directory, or s3://, gs://, as://  (default /models)
#   MODEL_CONTROL_MODE  explicit (default), none or poll
#   LOAD_MODELS         comma-separated models to load at start; required with explicit:
#                       the routers and the models their policies call, less on_demand ones
#                       (python -m orchestrator.tooling.deploy load-models prints them)
#   MODEL_CONFIG_NAME   read <model>/configs/NAME.pbtxt where it exists (cpu: embedded)
#   HTTP_PORT GRPC_PORT METRICS_PORT   (default 8000 8001 8002), BIND_ADDRESS (default 0.0.0.0)
#   EXIT_TIMEOUT_SECS   seconds Triton waits for in-flight requests on SIGTERM (default 30)
#   LOG_VERBOSE         Triton's --log-verbose (default 0)
#   TRITONSERVER        the server binary (default: tritonserver on PATH)
#   TRITON_ADMIN_KEY_FILE  file holding the admin key (default /var/run/secrets/orchestrator/admin/admin-key,
#                       a Secret mounted by the manifests). The model-repository, model-config,
#                       shared-memory, statistics, trace and logging APIs of HTTP and gRPC then
#                       need the header `admin-key: <key>` (gRPC: `triton-grpc-protocol-admin-key`);
#                       health, metadata and inference stay open. No key: the server is not started.
#   TRITON_ADMIN_UNRESTRICTED=1  start without a key: those APIs open to every client (local use only)
#   HTTP_MAX_INPUT_SIZE bytes: Triton's --http-max-input-size, where the server has it (Triton >= 2.59,
#                       read from TRITON_SERVER_VERSION, which NGC images set, else from `--help`)
#   TRACE_MODE          Triton request tracing (docs/reference/metrics.md, "Tracing"): off (default),
#                       opentelemetry (spans exported over OTLP/HTTP to OTEL_ENDPOINT) or triton
#                       (a JSON trace file, TRACE_FILE). Level TIMESTAMPS; the router's BLS calls
#                       (tokenizer, classifiers) are child spans of the routed request.
#   TRACE_RATE          trace every N-th request (default 1000, Triton's default); 0 with
#                       opentelemetry: only requests that bring a traceparent (propagated context)
#   OTEL_ENDPOINT       the collector's OTLP/HTTP traces URL (default http://localhost:4318/v1/traces,
#                       Triton's default: a collector sidecar). Resource attributes: OTEL_RESOURCE_ATTRIBUTES.
#   TRACE_FILE          triton mode: the trace file (default /tmp/triton-trace.json; Triton writes
#                       every 100 traces to TRACE_FILE.<index>)
# Arguments are passed on to tritonserver after these flags (a later flag wins).
# exec: tritonserver replaces this shell, so it gets SIGTERM from the kubelet directly and
# the router reads the model control mode from its parent's command line (/proc).
# The admin key is on tritonserver's command line (Triton takes it nowhere else): visible in
# /proc to the container's own processes, never printed by this script.
set +x  # an inherited SHELLOPTS=xtrace would print the key
set -euo pipefail

die() { echo "entrypoint: $*" >&2; exit 2; }

repository="${MODEL_REPOSITORY:-/models}"
mode="${MODEL_CONTROL_MODE:-explicit}"
load_models="${LOAD_MODELS:-}"
address="${BIND_ADDRESS:-0.0.0.0}"
server="${TRITONSERVER:-tritonserver}"
restricted="model-repository,model-config,shared-memory,statistics,trace,logging"

for var in HTTP_PORT GRPC_PORT METRICS_PORT EXIT_TIMEOUT_SECS LOG_VERBOSE HTTP_MAX_INPUT_SIZE TRACE_RATE; do
  value="${!var:-}"
  [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "$var must be a number, not '$value'"
done

args=("--model-repository=${repository}" "--model-control-mode=${mode}")
case "$mode" in
  explicit)
    [[ -n "${load_models//[ ,]/}" ]] || die "LOAD_MODELS is empty: with MODEL_CONTROL_MODE=explicit nothing would load (python -m orchestrator.tooling.deploy load-models prints the list)"
    IFS=',' read -ra models <<< "$load_models"
    for model in "${models[@]}"; do
      model="${model// /}"
      if [[ -n "$model" ]]; then
        args+=("--load-model=${model}")
      fi
    done
    ;;
  none|poll)
    [[ -z "$load_models" ]] || die "LOAD_MODELS is only used with MODEL_CONTROL_MODE=explicit (mode '$mode' loads every model of the repository)"
    ;;
  *)
    die "MODEL_CONTROL_MODE must be explicit, none or poll, not '$mode'"
    ;;
esac
if [[ -n "${MODEL_CONFIG_NAME:-}" ]]; then
  args+=("--model-config-name=${MODEL_CONFIG_NAME}")
fi
args+=(
  "--http-address=${address}" "--http-port=${HTTP_PORT:-8000}"
  "--grpc-address=${address}" "--grpc-port=${GRPC_PORT:-8001}"
  "--metrics-address=${address}" "--metrics-port=${METRICS_PORT:-8002}"
  "--allow-metrics=true"
  "--strict-readiness=true"
  "--exit-on-error=true"
  "--exit-timeout-secs=${EXIT_TIMEOUT_SECS:-30}"
  "--log-verbose=${LOG_VERBOSE:-0}"
)

# --- The control plane: the admin APIs behind the key from the Secret --------------------
key=""
case "${TRITON_ADMIN_UNRESTRICTED:-}" in
  1|true)
    echo "entrypoint: WARNING: TRITON_ADMIN_UNRESTRICTED is set: the ${restricted} APIs are open to every client that reaches the HTTP and gRPC ports (anyone may unload the router or load a model of their own)" >&2
    ;;
  ""|0|false)
    key_file="${TRITON_ADMIN_KEY_FILE:-/var/run/secrets/orchestrator/admin/admin-key}"
    [[ -f "$key_file" && -r "$key_file" ]] || die "no admin key: '$key_file' is not a readable file. Mount the Secret with the key there (docs/guides/security.md, \"Security\"), set TRITON_ADMIN_KEY_FILE, or set TRITON_ADMIN_UNRESTRICTED=1 to run with the admin APIs open"
    key="$(< "$key_file")"  # drops trailing newlines (kubectl create secret --from-file keeps them)
    [[ -n "$key" ]] || die "the admin key file '$key_file' is empty"
    # Triton prints the whole flag when it cannot parse it, and the key goes into a header:
    # only characters that need no quoting anywhere, and enough of them.
    [[ "$key" =~ ^[A-Za-z0-9._~+/=-]{16,}$ ]] || die "the admin key in '$key_file' is not shown; it must be at least 16 characters of A-Z a-z 0-9 . _ ~ + / = - (for example: openssl rand -hex 32)"
    args+=(
      "--http-restricted-api=${restricted}:admin-key=${key}"
      "--grpc-restricted-protocol=${restricted}:admin-key=${key}"
    )
    ;;
  *)
    die "TRITON_ADMIN_UNRESTRICTED must be 1, true, 0, false or unset, not '${TRITON_ADMIN_UNRESTRICTED}'"
    ;;
esac

# --- Request bodies: --http-max-input-size exists from Triton 2.59 (NGC 25.06) -----------
has_max_input_size() {
  local version="${TRITON_SERVER_VERSION:-}"
  if [[ "$version" =~ ^([0-9]+)\.([0-9]+) ]]; then
    local major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
    (( major > 2 || (major == 2 && minor >= 59) ))
    return
  fi
  # No version in the environment (not an NGC image): ask the binary. --help exits 1.
  local usage
  usage="$("$server" --help 2>&1 || true)"
  [[ "$usage" == *"--http-max-input-size"* ]]
}
if [[ -n "${HTTP_MAX_INPUT_SIZE:-}" ]]; then
  if has_max_input_size; then
    args+=("--http-max-input-size=${HTTP_MAX_INPUT_SIZE}")
  else
    echo "entrypoint: WARNING: this tritonserver (${TRITON_SERVER_VERSION:-version not set}) has no --http-max-input-size (Triton >= 2.59): HTTP_MAX_INPUT_SIZE=${HTTP_MAX_INPUT_SIZE} is not applied; bound request bodies at the ingress or proxy (docs/guides/security.md, \"Security\")" >&2
  fi
fi

# --- Request tracing (Triton 2.51 --trace-config; server docs/user_guide/trace.md) --------
trace_mode="${TRACE_MODE:-off}"
trace_rate="${TRACE_RATE:-1000}"
case "$trace_mode" in
  off|"")
    ;;
  opentelemetry)
    endpoint="${OTEL_ENDPOINT:-http://localhost:4318/v1/traces}"
    [[ "$endpoint" =~ ^https?://[^[:space:],]+$ ]] || die "OTEL_ENDPOINT must be an http:// or https:// URL without spaces or commas (the collector's OTLP/HTTP traces endpoint, e.g. http://otel-collector.observability:4318/v1/traces), not '$endpoint'"
    args+=(
      "--trace-config=mode=opentelemetry" "--trace-config=level=TIMESTAMPS" "--trace-config=rate=${trace_rate}"
      "--trace-config=opentelemetry,url=${endpoint}"
    )
    ;;
  triton)
    [[ "$trace_rate" != 0 ]] || die "TRACE_RATE=0 traces nothing in triton mode (it means: only requests with a propagated OpenTelemetry context)"
    trace_file="${TRACE_FILE:-/tmp/triton-trace.json}"
    [[ "$trace_file" != *,* ]] || die "TRACE_FILE must not contain a comma, not '$trace_file'"
    args+=(
      "--trace-config=mode=triton" "--trace-config=level=TIMESTAMPS" "--trace-config=rate=${trace_rate}"
      "--trace-config=triton,file=${trace_file}" "--trace-config=triton,log-frequency=100"
    )
    ;;
  *)
    die "TRACE_MODE must be off, opentelemetry or triton, not '$trace_mode'"
    ;;
esac

shown=("${args[@]}" "$@")
if [[ -n "$key" ]]; then
  shown=("${shown[@]//"$key"/<redacted>}")
fi
echo "entrypoint: ${server} ${shown[*]}" >&2
exec "$server" "${args[@]}" "$@"
