#!/usr/bin/env bash
# make images: the three images (accountant, party B, party A) with podman (or docker), from a
# local base and a wheel directory or package mirror given as build arguments, so a host that
# reaches no image registry (and perhaps only an internal package mirror) can build them.
#
#   deploy/build-images.sh [SERVICE ...]      (default: accountant party-b party-a)
#
# Environment (each optional; docs/deployment.md, "Building without a registry"):
#   BASE_IMAGE       the base every image builds FROM. Unset: deploy/base-image.sh makes
#                    localhost/vesper-base:bookworm from the OS package mirror (debootstrap,
#                    cached) and that is used. Set it to use another, e.g.
#                    python:3.11-slim-bookworm from a registry or a mirror of it
#   WHEELS           a wheel directory inside the repository, e.g. .wheelhouse/images/cp311
#                    (make wheelhouse-images): everything is installed from it, no index needed
#   PIP_INDEX_URL    a package mirror (with WHEELS: fills what the directory lacks)
#   TORCH_INDEX_URL  where torch comes from when WHEELS has none (default: the CPU build's index;
#                    set it empty for pip's own index, whose Linux torch is the CUDA build)
#   TORCH_SPEC       default torch==2.13.0
#   PIP_CA           a CA bundle for the index's TLS, handed to the build as the secret pip-ca
#                    (never stored in an image). Default: the bundle pip's configuration names
#                    (PIP_CERT, or `pip config get global.cert`), if any
#   TAG              the images' tag (default 0.1.0: vesper-accountant:0.1.0, ...)
#   ENGINE           podman or docker (default podman if installed); with podman,
#                    CONTAINERS_CONF defaults to deploy/containers.conf
# The images a build replaces (the same tag's previous image, and the previous install stage, kept
# as vesper-install:TAG so its layers are reused) are removed after it with their untagged layers,
# so building again and again (a CI runner, a developer) does not fill the disk; one that a
# container still uses is kept, with a line saying so.
# Prints each image's build time. Exit: 0 built; 2 set-up (a tool, a wheel directory); else the
# engine's own exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
engine="${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
command -v "$engine" >/dev/null || { echo "build-images: no $engine (apt-get install podman runc)" >&2; exit 2; }
if [ "$engine" = podman ]; then
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/containers.conf}"
fi
tag="${TAG:-0.1.0}"
services=("$@")
[ ${#services[@]} -gt 0 ] || services=(accountant party-b party-a)

if [ -z "${BASE_IMAGE:-}" ]; then
    BASE_IMAGE=localhost/vesper-base:bookworm
    ENGINE="$engine" deploy/base-image.sh "$BASE_IMAGE"
fi
args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}")
if [ -n "${WHEELS:-}" ]; then
    case "$WHEELS" in
        /*|../*) echo "build-images: WHEELS must be a directory inside the repository (the build context), got $WHEELS" >&2; exit 2 ;;
    esac
    ls "$WHEELS"/*.whl >/dev/null 2>&1 \
        || { echo "build-images: no wheels in $WHEELS (make wheelhouse-images makes .wheelhouse/images/cp311)" >&2; exit 2; }
    args+=(--build-arg "WHEELS=$WHEELS")
fi
[ -n "${PIP_INDEX_URL:-}" ] && args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
[ "${TORCH_INDEX_URL+set}" = set ] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
ca="${PIP_CA:-${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}}"
if [ -n "$ca" ]; then
    [ -s "$ca" ] || { echo "build-images: the CA bundle $ca does not exist" >&2; exit 2; }
    args+=(--secret "id=pip-ca,src=$ca")
fi
format=()
if [ "$engine" = docker ]; then
    export DOCKER_BUILDKIT=1  # RUN --mount (the CA secret) needs BuildKit
else
    format=(--format docker)  # podman's default, OCI, drops HEALTHCHECK
fi

image_id() { "$engine" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
# build IMAGE [ENGINE BUILD ARGUMENTS...]: build and tag IMAGE, then remove the image the tag named
# before (podman and docker remove its untagged parent layers with it)
build() {
    local image="$1" old new begun
    shift
    old=$(image_id "$image")
    begun=$(date +%s)
    "$engine" build "${format[@]}" "$@" -t "$image" "${args[@]}" . \
        || { code=$?; echo "build-images: $image failed ($code)" >&2; exit "$code"; }
    new=$(image_id "$image")
    if [ -n "$old" ] && [ "$old" != "$new" ]; then
        "$engine" rmi "$old" >/dev/null 2>&1 \
            && echo "== build-images: removed the image $image replaced (${old:0:12})" \
            || echo "== build-images: kept the image $image replaced (${old:0:12}): in use"
    fi
    echo "== build-images: $image in $(( $(date +%s) - begun )) s"
}

for service in "${services[@]}"; do
    [ -f "deploy/$service.Dockerfile" ] || { echo "build-images: no deploy/$service.Dockerfile" >&2; exit 2; }
done
# the install stage, the same in the three Dockerfiles: built (and tagged) once, reused by each
echo "== build-images: the install stage FROM $BASE_IMAGE${WHEELS:+, wheels $WHEELS}${PIP_INDEX_URL:+, index $PIP_INDEX_URL}"
build "vesper-install:$tag" -f "deploy/${services[0]}.Dockerfile" --target install
for service in "${services[@]}"; do
    echo "== build-images: vesper-$service:$tag FROM $BASE_IMAGE"
    build "vesper-$service:$tag" -f "deploy/$service.Dockerfile"
done
echo "== build-images: ${services[*]} in $(( $(date +%s) - started )) s"
