#!/usr/bin/env bash
# The images' base, made locally from the OS package mirror: no image registry needed.
#
#   deploy/base-image.sh [TAG]          (default TAG: localhost/vesper-base:bookworm)
#
# Debian bookworm (minbase) with python3.11, python3.11-venv and ca-certificates, made with
# debootstrap from MIRROR and imported with `podman import` (or `docker import`). The three
# Dockerfiles build FROM it with --build-arg BASE_IMAGE=TAG (deploy/build-images.sh passes it).
# The root file system is cached as a tarball under CACHE, keyed by suite, mirror and package
# list, so a second run only imports it (seconds); an image already tagged with the same key
# is kept as it is.
#
#   MIRROR   Debian mirror debootstrap fetches from (default http://deb.debian.org/debian;
#            a bank's internal mirror of it works the same)
#   SUITE    default bookworm (its python3.11 is the one vesper is tested with)
#   CACHE    where the tarball goes (default .vesper/images, which git and the build context ignore)
#   ENGINE   podman or docker (default: podman if installed, else docker)
# Needs root (debootstrap), debootstrap itself (apt-get install debootstrap) and the engine.
# Exit: 0 the image exists; 2 a tool is missing or not root.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-localhost/vesper-base:bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
suite="${SUITE:-bookworm}"
cache="${CACHE:-.vesper/images}"
packages="python3.11,python3.11-venv,python3-distutils,python3-pip-whl,python3-setuptools-whl,ca-certificates"
engine="${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
command -v "$engine" >/dev/null || { echo "base-image: no $engine (apt-get install podman runc)" >&2; exit 2; }

# what the image is made with: the root file system's key names the cached tarball, and the
# image's key adds the settings `import` gives it (a debootstrap tree has no image config: no PATH)
changes=(
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "ENV LANG=C.UTF-8"
    'CMD ["/bin/bash"]'
)
key=$(printf '%s\n' "$suite" "$mirror" "$packages" "minbase" | sha256sum | cut -c1-16)
image_key=$(printf '%s\n' "$key" "${changes[@]}" | sha256sum | cut -c1-16)
if [ "$("$engine" image inspect --format '{{ index .Config.Labels "vesper.base.key" }}' "$tag" 2>/dev/null || true)" = "$image_key" ]; then
    echo "base-image: $tag is up to date ($suite, key $key)"
    exit 0
fi

tarball="$cache/base-$suite-$key.tar"
if [ ! -s "$tarball" ]; then
    [ "$(id -u)" = 0 ] || { echo "base-image: debootstrap needs root (or bring $tarball from a machine that made it)" >&2; exit 2; }
    command -v debootstrap >/dev/null || { echo "base-image: no debootstrap (apt-get install debootstrap)" >&2; exit 2; }
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "base-image: debootstrap $suite from $mirror (a few minutes; cached in $tarball)"
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" > "$root.log" 2>&1 \
        || { tail -n 20 "$root.log" >&2; echo "base-image: debootstrap failed (log: $root.log)" >&2; exit 1; }
    rm -f "$root.log"
    # what an image needs no copy of: downloaded packages, package lists, documentation
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/tmp/*
    tar --numeric-owner -C "$root" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
fi
echo "base-image: importing $tarball as $tag"
flags=(--change "LABEL vesper.base.key=$image_key" --change "LABEL vesper.base.suite=$suite")
for change in "${changes[@]}"; do
    flags+=(--change "$change")
done
"$engine" import --quiet "${flags[@]}" "$tarball" "$tag" >/dev/null
echo "base-image: $tag ($(du -m "$tarball" | cut -f1) MiB uncompressed)"
