#!/usr/bin/env bash
# Build triton_python_backend_stub for Python PYTHON from python_backend at the Triton
# release TRITON, inside the matching NGC tritonserver container (stub_build/Dockerfile).
#
#   bash stub_build/build.sh [--dry-run] PYTHON TRITON [OUT]
#   e.g. bash stub_build/build.sh 3.12 r24.10      (make stub PYTHON=3.12 TRITON=r24.10)
#
# PYTHON: 3.X. TRITON: the release branch r<yy.mm> (Triton 2.51.0 = r24.10, the embedded
# server's). OUT: output root (default stub_build/out); the stub goes to
# OUT/<PYTHON>/triton_python_backend_stub with stub.json and ldd.txt beside it.
# Environment: TRITON_ENABLE_GPU (ON), PYBIND11_TAG (empty: the branch's pin).
# --dry-run prints the image, the branch and the docker commands, and needs no Docker.
#
# Exit status: 0 built and checked; 2 bad arguments; 3 no Docker CLI or no Docker engine
# reachable; 4 the docker build failed; 5 the stub does not link libpython<PYTHON>.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry_run=1
    shift
fi

usage() {
    echo "usage: bash stub_build/build.sh [--dry-run] PYTHON TRITON [OUT]   (e.g. 3.12 r24.10)" >&2
    exit 2
}

[[ $# -ge 2 && $# -le 3 ]] || usage
python_version="$1"
triton="$2"
out_root="${3:-$here/out}"

if [[ ! "$python_version" =~ ^3\.[0-9]+$ ]]; then
    echo "error: PYTHON must look like 3.12, got '$python_version'" >&2
    exit 2
fi
if [[ ! "$triton" =~ ^r[0-9]{2}\.[0-9]{2}$ ]]; then
    echo "error: TRITON must be a release branch like r24.10 (Triton 2.51.0), got '$triton'" >&2
    exit 2
fi

release="${triton#r}"                               # 24.10: the NGC image tag's version
image="nvcr.io/nvidia/tritonserver:${release}-py3"  # what the Dockerfile's FROM resolves to
tag="orchestrator-stub:${triton}-py${python_version}"
gpu="${TRITON_ENABLE_GPU:-ON}"
pybind11_tag="${PYBIND11_TAG:-}"
out_dir="$out_root/$python_version"

build_cmd=(docker build
    --build-arg "TRITON_RELEASE=$release"
    --build-arg "TRITON_BRANCH=$triton"
    --build-arg "PYTHON_VERSION=$python_version"
    --build-arg "TRITON_ENABLE_GPU=$gpu"
    --build-arg "PYBIND11_TAG=$pybind11_tag"
    -t "$tag" -f "$here/Dockerfile" "$here")

if [[ $dry_run -eq 1 ]]; then
    echo "base image: $image"
    echo "python_backend branch: $triton"
    echo "python: $python_version"
    echo "output: $out_dir/triton_python_backend_stub"
    echo "command: ${build_cmd[*]}"
    exit 0
fi

no_docker() {
    {
        echo "error: $1"
        echo "  make stub PYTHON=$python_version TRITON=$triton builds the stub inside $image,"
        echo "  which needs a running Docker engine. Run it on a machine with Docker, or, for the"
        echo "  embedded server (Triton 2.51 = r24.10), use its prebuilt stubs offline:"
        echo "    make stub PYTHON=$python_version"
    } >&2
    exit 3
}

command -v docker >/dev/null 2>&1 || no_docker "the docker CLI is not installed (no 'docker' on PATH)"
if ! info_out="$(timeout 30 docker info 2>&1)"; then
    reason="$(printf '%s\n' "$info_out" | grep -iE 'cannot connect|error|denied|refused' | head -n 1)"
    no_docker "no Docker engine reachable (docker info: ${reason:-failed})"
fi

echo "building $tag from $image (python_backend $triton, Python $python_version, GPU $gpu)" >&2
"${build_cmd[@]}" || { echo "error: docker build failed: ${build_cmd[*]}" >&2; exit 4; }

mkdir -p "$out_dir"
cid="$(docker create "$tag")"
trap 'docker rm -f "$cid" >/dev/null 2>&1 || true' EXIT
docker cp "$cid:/opt/stub/triton_python_backend_stub" "$out_dir/triton_python_backend_stub"
docker cp "$cid:/opt/stub/ldd.txt" "$out_dir/ldd.txt"

# ldd inside the image (where its libpython exists) was checked by the Dockerfile; check
# the copied output again so a stale image cannot pass.
libpython_line="$(grep -E "libpython${python_version//./\\.}\.so" "$out_dir/ldd.txt" || true)"
if [[ -z "$libpython_line" ]]; then
    echo "error: $out_dir/triton_python_backend_stub does not link libpython$python_version; ldd in the image said:" >&2
    cat "$out_dir/ldd.txt" >&2
    exit 5
fi
cat > "$out_dir/stub.json" <<JSON
{
  "source": "python_backend $triton built in $image (stub_build/build.sh)",
  "triton_release": "$triton",
  "python": "$python_version",
  "ldd_libpython": "$(echo "$libpython_line" | sed 's/^[[:space:]]*//; s/"/\\"/g')"
}
JSON
echo "stub: $out_dir/triton_python_backend_stub"
echo "  $libpython_line"
