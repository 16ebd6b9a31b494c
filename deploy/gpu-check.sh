#!/usr/bin/env bash
# make gpu-check: vesper's CUDA path on a machine with one NVIDIA GPU, in under 8 minutes.
#
# For a GPU host that reaches no package index and has its own python with a CUDA build of
# torch (any recent version): vesper and its other dependencies install from the wheel
# directory `make wheelhouse` built (.wheelhouse/cpXY, small enough to travel with the
# working tree), into a scratch folder that shadows nothing of the host's but what it
# names. Then the CUDA-marked tests run, and `vesper bench device` times PMP-GCN's layers
# and a training step on the CPU and on the GPU in one run; one table shows it all.
#
# Usage: deploy/gpu-check.sh [--dry-run] [--python PY] [--wheelhouse DIR] [--out DIR] [--nodes N]
#   --dry-run     the CPU stands in for the GPU (runs here, end to end; the CUDA tests skip)
#   --python      the interpreter with torch (default python3; the dry run: .venv/bin/python)
#   --wheelhouse  default .wheelhouse
#   --out         where the table, the test log and the figures' JSON go (default
#                 .vesper/gpu-check; $OUT when set, as on the lent GPU machines)
#   --nodes       the synthetic graph's nodes for the figures (default 100000, mean degree 20)
# Exit: 0 all passed; 1 a CUDA test failed; 2 set-up (wheelhouse, install); 3 no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
dry=0
python=""
wheelhouse=.wheelhouse
out="${OUT:-.vesper/gpu-check}"
nodes=100000
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --python) python="$2"; shift ;;
    --wheelhouse) wheelhouse="$2"; shift ;;
    --out) out="$2"; shift ;;
    --nodes) nodes="$2"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$python" ] || { if [ "$dry" = 1 ]; then python=.venv/bin/python; else python=python3; fi; }
mkdir -p "$out"
step() { echo "== gpu-check [$(( $(date +%s) - started )) s] $*"; }

step "the interpreter and its torch"
"$python" - "$dry" <<'PY'
import sys

import torch

dry = sys.argv[1] == "1"
cuda = torch.cuda.is_available()
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA build {torch.version.cuda}, "
      f"CUDA available {cuda}" + (f": {torch.cuda.get_device_name(0)}" if cuda else ""))
if not cuda and not dry:
    print("gpu-check: this torch sees no CUDA device; on a CPU machine run the dry run (make gpu-check-dry-run)",
          file=sys.stderr)
    sys.exit(3)
PY

step "vesper and its dependencies from $wheelhouse (no package index)"
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
wheels="$wheelhouse/$tag"
if ! ls "$wheels"/vesper-*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheelhouse for Python $version in $wheels: on a machine with the package index, run" \
       "make wheelhouse PYTHON_VERSION=$version, and bring $wheels along" >&2
  exit 2
fi
site="$(mktemp -d)/site"
# --no-deps: the wheelhouse holds every dependency but torch and what the host is known to
# have (deploy/wheelhouse.sh, EXCLUDE); --ignore-requires-python: vesper is tested on 3.11
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-requires-python \
  --target "$site" "$wheels"/*.whl
export PYTHONPATH="$site"
"$python" -c 'import vesper.party_a.run, vesper.party_b.session, torch; print("vesper imports with torch", torch.__version__)'

step "the CUDA-marked tests"
# only the files that hold CUDA tests are collected: the others may need test-only packages
files=$(grep -l "pytest.mark.cuda" tests/test_*.py | tr '\n' ' ')
set +e
# shellcheck disable=SC2086
"$python" -m pytest -q -p no:cacheprovider -m cuda --junitxml "$out/cuda-tests.xml" $files 2>&1 | tee "$out/cuda-tests.log" | tail -n 15
set -e

step "CPU against $( [ "$dry" = 1 ] && echo "the CPU (dry run)" || echo CUDA ): PMP-GCN layers and a training step"
dataset="$out/synthetic-$nodes.npz"
[ -f "$dataset" ] || "$python" -m vesper.coordinator data synth "$dataset" --nodes "$nodes" --profile dense \
  --mean-degree 20 --features 64 >/dev/null
device=cuda
[ "$dry" = 1 ] && device=cpu
set +e
"$python" -m vesper.coordinator bench device --device "$device" --dataset "$dataset" --junit "$out/cuda-tests.xml" \
  --out "$out/device.json" --workdir "$out/work" 2>&1 | tee "$out/table.txt"
code=${PIPESTATUS[0]}
set -e
step "done in $(( $(date +%s) - started )) s (goal: under 480 s); the table: $out/table.txt"
exit "$code"
