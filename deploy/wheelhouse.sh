#!/usr/bin/env bash
# make wheelhouse: vesper and the Python packages it needs besides torch, as wheels for a
# machine that reaches no package index (the GPU check, deploy/gpu-check.sh; an air-gapped
# bank host). Usage: deploy/wheelhouse.sh [PYTHON_VERSION] [OUT]
#
#   PYTHON_VERSION  the target interpreter's X.Y (default 3.12, the GPU machines' python);
#                   the wheels land in OUT/cpXY
#   OUT             default .wheelhouse (git ignores it)
#   EXCLUDE         space-separated distributions the target already has and that are too
#                   large to carry; default: numpy, scipy, pyarrow and matplotlib with its
#                   dependencies, which the GPU machines' image holds (/work/.library/device)
#   WITH_TORCH      a pinned torch (torch==2.13.0) to add, with its own dependencies, and the
#                   package's build requirements (setuptools): a wheel directory an image can be
#                   built from with no index at all (make wheelhouse-images; docs/deployment.md).
#                   TORCH_INDEX_URL: where that torch build is found besides pip's configuration
#
# The versions are this checkout's virtual environment's (pip freeze), so the target runs
# what `make test` tested. Without WITH_TORCH torch is not included: the target brings its own
# (CUDA) build.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
out="${2:-.wheelhouse}"
exclude="${EXCLUDE-numpy scipy pyarrow matplotlib contourpy fonttools kiwisolver pillow cycler pyparsing python-dateutil}"
python=.venv/bin/python
[ -x "$python" ] || { echo "wheelhouse: no .venv here; run make test (or make demo) first" >&2; exit 2; }
tag="cp${version/./}"
dir="$out/$tag"
rm -rf "$dir" && mkdir -p "$dir"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$python" -m pip freeze --exclude-editable | grep -viE '^(torch|nvidia-|triton)' > "$constraints"
# the runtime requirements of pyproject.toml, torch left out
requirements=$("$python" - <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.replace(" ", "").startswith("torch")))
PY
)
with_torch="${WITH_TORCH:-}"
if [ -n "$with_torch" ]; then
  case "$with_torch" in
    torch==*) ;;
    *) echo "wheelhouse: WITH_TORCH must pin torch exactly (torch==X.Y.Z), got '$with_torch'" >&2; exit 2 ;;
  esac
  # torch and what it needs, and what building vesper from source needs (pyproject's build-system)
  requirements="$requirements
$with_torch
$("$python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')"
fi
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
echo "wheelhouse: downloading for Python $version into $dir"
# shellcheck disable=SC2086
"$python" -m pip download -q --only-binary=:all: --python-version "$version" --implementation cp \
  --abi "$tag" --abi abi3 --abi none "${platforms[@]}" -c "$constraints" -d "$dir" \
  ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} $requirements 2> >(grep -v "is ignored: it is neither" >&2)
for name in $exclude; do
  rm -f "$dir/${name//-/_}"-[0-9]*.whl
done
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dir" . 2>&1 | grep -v "^$" || true
rm -rf build vesper.egg-info/SOURCES.txt.bak
size=$(du -sm "$dir" | cut -f1)
echo "wheelhouse: $(ls "$dir" | wc -l) wheels, ${size} MiB in $dir (left out, the target must have them: ${exclude:-none})"
