# syntax=docker/dockerfile:1
# Party A, the graph holder (e.g. a payment platform): graph, features, encoder, extractor.
# One image for GPU and CPU hosts: torch's CUDA build runs on CPU when no GPU is given
# (set party_a.device = "cuda" and start the container with GPUs to use one).
# Build context: the repository root (docker compose build party-a, or
#   docker build -f deploy/party-a.Dockerfile -t vesper-party-a .).
#
# The base only adds what the NVIDIA container toolkit needs to hand the host's driver in;
# the CUDA 13.0 runtime libraries come with torch's wheel. Needs a host driver for CUDA 13.
FROM nvidia/cuda:13.0.0-base-ubuntu22.04

# empty: pip's index, whose torch==2.13.0 Linux wheel is the CUDA 13.0 build; for an older
# driver, e.g. --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG TORCH_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DEBIAN_FRONTEND=noninteractive \
    HOME=/var/lib/vesper \
    PATH=/opt/vesper/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# the shared install step (tests/test_deploy.py runs the same script); the source is only
# mounted for the build, so it is not left in the image
RUN --mount=type=bind,target=/src,rw \
    sh /src/deploy/install.sh /opt/vesper "torch==2.13.0" "$TORCH_INDEX_URL"

# a fixed unprivileged uid, so files on the host (keys, tokens, data) can be given to it
RUN groupadd --gid 10001 vesper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/vesper --shell /usr/sbin/nologin vesper \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/vesper /var/lib/vesper/party_a \
    && install -d -m 0755 /etc/vesper /etc/vesper/tls /data/vesper

USER 10001:10001
WORKDIR /var/lib/vesper
EXPOSE 50051
HEALTHCHECK --interval=15s --timeout=10s --start-period=90s --retries=3 \
    CMD ["vesper", "health", "--config", "/etc/vesper/platform.toml", "party-a"]
ENTRYPOINT ["vesper", "serve", "party-a", "--config", "/etc/vesper/platform.toml"]
