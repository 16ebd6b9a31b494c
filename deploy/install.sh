#!/bin/sh
# Install vesper into a fresh virtual environment: the one install step of every image
# (deploy/*.Dockerfile RUN it), and tests/test_deploy.py runs the same script in a fresh
# venv, so what the images install is tested even where no container engine runs.
#
#   deploy/install.sh [--step torch|vesper|all] [--wheels DIR] VENV TORCH_SPEC [TORCH_INDEX_URL]
#
#   --step           torch: make VENV and install the pinned torch only (the images' first,
#                    shared layer); vesper: install the package into the VENV the torch step
#                    made; all (default): both
#   --wheels DIR     a wheel directory (e.g. `make wheelhouse-images`): torch comes from it when
#                    it holds a torch wheel, and everything is installed with --no-index from it
#                    alone, unless PIP_INDEX_URL is set (then that index fills what DIR lacks).
#                    A directory without wheels is ignored (the images' default, deploy/wheels)
#   VENV             where the environment goes (the images use /opt/vesper)
#   TORCH_SPEC       the torch requirement, pinned: torch==2.13.0
#   TORCH_INDEX_URL  where that torch build comes from (e.g. https://download.pytorch.org/whl/cpu);
#                    empty or absent: pip's configured index (PyPI's Linux wheel is the CUDA build)
#
# Environment:
#   PYTHON           the interpreter that creates VENV; default python3.11
#   PIP_INDEX_URL    a package mirror for everything but torch (pip reads it itself; empty = unset)
#   PIP_CA           a CA bundle for the index's TLS, e.g. a bank's proxy CA; default
#                    /run/secrets/pip-ca, where the Dockerfiles mount the build secret pip-ca
#
# The package is installed from the directory above this script (the build context).
set -eu

step=all
wheels=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --step) step=${2:-}; shift 2 ;;
        --wheels) wheels=${2:-}; shift 2 ;;
        --) shift; break ;;
        -*) echo "$0: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
case "$step" in
    torch|vesper|all) ;;
    *) echo "$0: --step must be torch, vesper or all, got '$step'" >&2; exit 2 ;;
esac
if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 [--step torch|vesper|all] [--wheels DIR] VENV TORCH_SPEC [TORCH_INDEX_URL]" >&2
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
if [ "$step" = vesper ]; then
    if [ ! -x "$venv/bin/python" ]; then
        echo "$0: $venv has no python; run --step torch first" >&2
        exit 2
    fi
elif [ -e "$venv" ]; then
    echo "$0: $venv already exists; the install starts from a fresh environment" >&2
    exit 2
fi
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
    echo "$0: --wheels $wheels is not a directory" >&2
    exit 2
fi
if [ -n "$wheels" ] && ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    wheels=""  # the images' placeholder: no wheels, the indexes supply everything
fi
# an empty build argument arrives as an empty variable, which pip would take for a URL
if [ -z "${PIP_INDEX_URL:-}" ]; then
    unset PIP_INDEX_URL
fi
ca=${PIP_CA:-/run/secrets/pip-ca}
if [ -s "$ca" ]; then
    export PIP_CERT="$ca"
fi

pip="$venv/bin/python -m pip --no-cache-dir --disable-pip-version-check"

# torch first and pinned: the package's own range (torch>=2.13,<2.14) is then already met, so
# resolving the rest never swaps in another torch build
if [ "$step" != vesper ]; then
    "$python" -m venv "$venv"
    if [ -n "$wheels" ] && ls "$wheels"/torch-*.whl >/dev/null 2>&1; then
        # torch's own dependencies from the directory too, or from the mirror when one is given
        if [ -n "${PIP_INDEX_URL:-}" ]; then
            $pip install --find-links "$wheels" "$torch_spec"
        else
            $pip install --no-index --find-links "$wheels" "$torch_spec"
        fi
    elif [ -n "$torch_index" ]; then
        $pip install --index-url "$torch_index" "$torch_spec"
    else
        $pip install "$torch_spec"
    fi
fi

if [ "$step" != torch ]; then
    # the torch the first step installed must still be the pinned one
    installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')
    if [ "torch==$installed" != "$torch_spec" ]; then
        echo "$0: $venv holds torch $installed, not $torch_spec" >&2
        exit 2
    fi
    if [ -z "$wheels" ]; then
        $pip install "$source_dir"
    elif [ -n "${PIP_INDEX_URL:-}" ]; then
        $pip install --find-links "$wheels" "$source_dir"
    else
        $pip install --no-index --find-links "$wheels" "$source_dir"
    fi
    "$venv/bin/vesper" --help >/dev/null
    echo "installed vesper into $venv with $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
else
    echo "installed $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') into $venv"
fi
