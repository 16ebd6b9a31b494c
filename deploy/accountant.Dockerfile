# syntax=docker/dockerfile:1
# The accountant: the privacy ledger (gRPC for charges, REST status for anyone).
# Build context: the repository root (docker compose build accountant, or
#   podman build -f deploy/accountant.Dockerfile -t vesper-accountant:0.1.0 .).
# The accountant never imports torch, but the package declares it: the pinned CPU wheel
# keeps pip from pulling the CUDA build (gigabytes) to satisfy that declaration.
# Build arguments (docs/deployment.md, "Building without a registry"):
#   BASE_IMAGE       any Debian or Ubuntu image with python3.11 and its venv module; default
#                    python:3.11-slim-bookworm from a registry; deploy/base-image.sh makes one
#                    from the OS package mirror alone (localhost/vesper-base:bookworm)
#   TORCH_SPEC       the pinned torch (default torch==2.13.0)
#   TORCH_INDEX_URL  where that torch build comes from (default the CPU build's index)
#   PIP_INDEX_URL    a package mirror for everything else (default: pip's, PyPI)
#   WHEELS           a wheel directory inside the build context; torch and everything else are
#                    taken from it, with no index unless PIP_INDEX_URL is given (default
#                    deploy/wheels, which holds none; `make wheelhouse-images` makes a full one)
#   secret pip-ca    a CA bundle for the index's TLS (a proxy's or a mirror's own CA):
#                    --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt
# deploy/build-images.sh builds the three images with these.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# -- the install stage: the same text in the three Dockerfiles, so the three builds share its
#    layers (torch once, vesper once); only /opt/vesper leaves it
FROM ${BASE_IMAGE} AS install
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=""
ARG WHEELS=deploy/wheels
COPY deploy/install.sh /build/install.sh
COPY ${WHEELS} /build/wheels
# torch first, in its own layer: it changes only with the build arguments, not with the source
RUN --mount=type=secret,id=pip-ca \
    sh /build/install.sh --step torch --wheels /build/wheels /opt/vesper "$TORCH_SPEC" "$TORCH_INDEX_URL"
# the package's sources alone, named one by one (tests/test_deploy.py checks the list against
# pyproject.toml): a wheel directory or anything else in the build context stays out
COPY pyproject.toml README.md /build/src/
COPY deploy/install.sh /build/src/deploy/
COPY proto /build/src/proto
COPY common /build/src/common
COPY party_a /build/src/party_a
COPY party_b /build/src/party_b
COPY accountant /build/src/accountant
COPY coordinator /build/src/coordinator
COPY benchmarks /build/src/benchmarks
COPY auditor /build/src/auditor
RUN --mount=type=secret,id=pip-ca \
    sh /build/src/deploy/install.sh --step vesper --wheels /build/wheels /opt/vesper "$TORCH_SPEC"

# -- the image: the base, the unprivileged user and /opt/vesper (these layers shared as well)
FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/vesper \
    PATH=/opt/vesper/bin:$PATH
# a fixed unprivileged uid, so files on the host (keys, tokens, data) can be given to it
RUN groupadd --gid 10001 vesper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/vesper --shell /usr/sbin/nologin vesper
COPY --from=install /opt/vesper /opt/vesper

# this image's own: its state directory (the ledger's volume is mounted on it) and config paths
RUN install -d -o 10001 -g 10001 -m 0700 /var/lib/vesper /var/lib/vesper/accountant \
    && install -d -m 0755 /etc/vesper /etc/vesper/tls /etc/vesper/tokens

USER 10001:10001
WORKDIR /var/lib/vesper
VOLUME ["/var/lib/vesper/accountant"]
EXPOSE 50053 8080
HEALTHCHECK --interval=15s --timeout=10s --start-period=30s --retries=3 \
    CMD ["vesper", "health", "--config", "/etc/vesper/accountant.toml", "accountant"]
ENTRYPOINT ["vesper", "serve", "accountant", "--config", "/etc/vesper/accountant.toml"]
