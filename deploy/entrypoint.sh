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
# Arguments are passed on to tritonserver after these flags (a later flag wins).
# exec: tritonserver replaces this shell, so it gets SIGTERM from the kubelet directly and
# the router reads the model control mode from its parent's command line (/proc).
set -euo pipefail

die() { echo "entrypoint: $*" >&2; exit 2; }

repository="${MODEL_REPOSITORY:-/models}"
mode="${MODEL_CONTROL_MODE:-explicit}"
load_models="${LOAD_MODELS:-}"
address="${BIND_ADDRESS:-0.0.0.0}"

for var in HTTP_PORT GRPC_PORT METRICS_PORT EXIT_TIMEOUT_SECS LOG_VERBOSE; do
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

echo "entrypoint: ${TRITONSERVER:-tritonserver} ${args[*]} $*" >&2
exec "${TRITONSERVER:-tritonserver}" "${args[@]}" "$@"
