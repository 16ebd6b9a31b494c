#!/bin/sh
# Install vesper into a fresh virtual environment: the one install step of every image
# (deploy/*.Dockerfile RUN it), and tests/test_deploy.py runs the same script in a fresh
# venv, so what the images install is tested even where no docker engine runs.
#
#   deploy/install.sh VENV TORCH_SPEC [TORCH_INDEX_URL]
#
#   VENV             where the environment goes (the images use /opt/vesper)
#   TORCH_SPEC       the torch requirement, pinned: torch==2.13.0
#   TORCH_INDEX_URL  where that torch build comes from (e.g. https://download.pytorch.org/whl/cpu);
#                    empty or absent: pip's configured index (PyPI's Linux wheel is the CUDA build)
#   PYTHON           (environment) the interpreter that creates VENV; default python3.11
#
# The package is installed from the directory above this script (the build context).
set -eu

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 VENV TORCH_SPEC [TORCH_INDEX_URL]" >&2
    exit 2
fi
venv=$1
torch_spec=$2
torch_index=${3:-}
python=${PYTHON:-python3.11}
source_dir=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)

case "$torch_spec" in
    torch==*) ;;
    *) echo "$0: TORCH_SPEC must pin torch exactly (torch==X.Y.Z), got '$torch_spec'" >&2; exit 2 ;;
esac
if [ -e "$venv" ]; then
    echo "$0: $venv already exists; the install starts from a fresh environment" >&2
    exit 2
fi

"$python" -m venv "$venv"
pip="$venv/bin/python -m pip --no-cache-dir --disable-pip-version-check"

# torch first and pinned: the package's own range (torch>=2.13,<2.14) is then already met, so
# resolving the rest never swaps in another torch build
if [ -n "$torch_index" ]; then
    $pip install --index-url "$torch_index" "$torch_spec"
else
    $pip install "$torch_spec"
fi
$pip install "$source_dir"

"$venv/bin/vesper" --help >/dev/null
echo "installed vesper into $venv with $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
