# syntax=docker/dockerfile:1
# The accountant: the privacy ledger (gRPC for charges, REST status for anyone).
# Build context: the repository root (docker compose build accountant, or
#   docker build -f deploy/accountant.Dockerfile -t vesper-accountant .).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/vesper \
    PATH=/opt/vesper/bin:$PATH

# the accountant never imports torch, but the package declares it: the pinned CPU wheel
# keeps pip from pulling the CUDA build (gigabytes) to satisfy that declaration
RUN --mount=type=bind,target=/src,rw \
    sh /src/deploy/install.sh /opt/vesper "torch==2.13.0" https://download.pytorch.org/whl/cpu

# a fixed unprivileged uid, so files on the host (keys, tokens) can be given to it
RUN groupadd --gid 10001 vesper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/vesper --shell /usr/sbin/nologin vesper \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/vesper /var/lib/vesper/accountant \
    && install -d -m 0755 /etc/vesper /etc/vesper/tls /etc/vesper/tokens

USER 10001:10001
WORKDIR /var/lib/vesper
EXPOSE 50053 8080
HEALTHCHECK --interval=15s --timeout=10s --start-period=30s --retries=3 \
    CMD ["vesper", "health", "--config", "/etc/vesper/accountant.toml", "accountant"]
ENTRYPOINT ["vesper", "serve", "accountant", "--config", "/etc/vesper/accountant.toml"]
