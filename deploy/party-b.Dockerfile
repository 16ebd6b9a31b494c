# syntax=docker/dockerfile:1
# Party B, the label holder (e.g. a bank): the decoder, on CPU.
# Build context: the repository root (docker compose build party-b, or
#   docker build -f deploy/party-b.Dockerfile -t vesper-party-b .).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/vesper \
    PATH=/opt/vesper/bin:$PATH

# the shared install step (tests/test_deploy.py runs the same script); the source is only
# mounted for the build, so it is not left in the image
RUN --mount=type=bind,target=/src,rw \
    sh /src/deploy/install.sh /opt/vesper "torch==2.13.0" https://download.pytorch.org/whl/cpu

# a fixed unprivileged uid, so files on the host (keys, tokens) can be given to it
RUN groupadd --gid 10001 vesper \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/vesper --shell /usr/sbin/nologin vesper \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/vesper /var/lib/vesper/party_b \
    && install -d -m 0755 /etc/vesper /etc/vesper/tls /data/vesper

USER 10001:10001
WORKDIR /var/lib/vesper
EXPOSE 50052
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 \
    CMD ["vesper", "health", "--config", "/etc/vesper/bank.toml", "party-b"]
ENTRYPOINT ["vesper", "serve", "party-b", "--config", "/etc/vesper/bank.toml"]
