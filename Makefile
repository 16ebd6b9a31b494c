# Set-up on a fresh machine is two commands: `make demo` and `make test`.
# Both create .venv (Python 3.11) and install vesper into it the first time.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-containers bench-peer images wheelhouse-images bench-accounting bench-extractors bench-extractors-sweep bench-label-privacy bench-degradation bench-soak bench-perf results results-quick proto check-proto clean wheelhouse gpu-check gpu-check-dry-run
TOLOKERS ?= ../shared/data/tolokers.npz

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull the CUDA build (gigabytes).
	# On a GPU host, install your CUDA build of torch==$(TORCH_VERSION) into $(VENV) first.
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vesper demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=15

# the long drills (kill -9 and resume of each service, a killed demo or worker, a whole run over
# mutual TLS, the RPC fuzzers and the metrics' training run, the install steps of the images in a
# fresh virtual environment, two hosts in network namespaces) and the sweeps whose first case
# make test runs; .ci/run runs them too
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# the three images built with podman from a local base (deploy/base-image.sh: debootstrap from
# the OS package mirror, cached) and from a wheel directory (wheelhouse-images), then run as
# containers on a private network with mutual TLS: a short run from the host, party B's
# container killed mid-run and started again, the run resumed, the ledger verified
# (tests/test_containers.py; skipped, saying why, without a podman that can run containers;
# about 5-10 minutes the first time, most of it the images). .ci/run runs it where podman is.
test-containers: $(STAMP)
	$(BIN)/python -m pytest -q -m containers tests/test_containers.py

# vesper-accountant, vesper-party-b, vesper-party-a:0.1.0 (podman, else docker). The build
# arguments come from the environment: BASE_IMAGE, WHEELS, PIP_INDEX_URL, TORCH_INDEX_URL,
# PIP_CA (deploy/build-images.sh; docs/deployment.md, "Building without a registry"). E.g.
#   make wheelhouse-images && make images WHEELS=.wheelhouse/images/cp311
images:
	deploy/build-images.sh

# a wheel directory the images install from with no index: vesper's dependencies, the pinned
# CPU torch and the build requirements, for the images' python 3.11 (.wheelhouse/images/cp311)
wheelhouse-images: $(STAMP)
	EXCLUDE= WITH_TORCH="torch==$(TORCH_VERSION)" deploy/wheelhouse.sh 3.11 .wheelhouse/images

# a benchmark command, not a timed test: calibration time and peak memory per accountant
bench-accounting: $(STAMP)
	$(BIN)/vesper bench accounting --steps 1000 --steps 10000

# the extractors side by side at epsilon 4, 5 seeds, Cora and Tolokers (resumable; see docs/extractors/)
bench-extractors: $(STAMP)
	$(BIN)/vesper bench extractors --dataset cora --dataset $(TOLOKERS) --epsilon 4 --seeds 5 \
		--out docs/extractors/results

# relational pre-training and HeterPoisson beside the MLP and GAP (the best of the first
# extractors) at epsilon 1, 4 and 8, 5 seeds, two runs at a time (resumable; docs/extractors/sweep/)
bench-extractors-sweep: $(STAMP)
	$(BIN)/vesper bench extractors --dataset cora --dataset $(TOLOKERS) \
		--extractor mlp --extractor gap --extractor relational --extractor relational-gap --extractor heterpoisson \
		--epsilon 1 --epsilon 4 --epsilon 8 --seeds 5 --jobs 2 --out docs/extractors/sweep

# label leakage to party A against B's label epsilon (1, 2, 4, 8, inf), rr and pate, 3 seeds,
# on Tolokers and Cora, two runs at a time (resumable; docs/label-privacy/)
bench-label-privacy: $(STAMP)
	$(BIN)/vesper bench label-privacy --dataset $(TOLOKERS) --seeds 3 --jobs 2 --out docs/label-privacy/tolokers
	$(BIN)/vesper bench label-privacy --dataset cora --seeds 3 --jobs 2 --out docs/label-privacy/cora

# issue #21's degradation table (docs/utility.md, section 7): every installed edge-level
# extractor against the MLP on the six development graphs at epsilon 1, 4, 8 and inf, 5 seeds,
# in one process, two runs at a time (resumable; about 2.5 hours on 2 cores). A first run starts
# from DEGRADATION_ROWS, the table's committed runs, and DEGRADATION_SPEC, the synthetic graphs
# they were made on (checked against the regenerated graphs), so it makes only what is missing:
# nothing, until an extractor is added or a row is removed.
DEGRADATION_OUT ?= bench/degradation
DEGRADATION_ROWS ?= docs/utility-runs.csv
DEGRADATION_SPEC ?= docs/utility-runs-spec.json
bench-degradation: $(STAMP)
	mkdir -p $(DEGRADATION_OUT)/data
	test -f $(DEGRADATION_OUT)/results.csv || cp $(DEGRADATION_ROWS) $(DEGRADATION_OUT)/results.csv
	test -f $(DEGRADATION_OUT)/data/spec.json || cp $(DEGRADATION_SPEC) $(DEGRADATION_OUT)/data/spec.json
	$(BIN)/vesper bench degradation --epsilon 1 --epsilon 4 --epsilon 8 --epsilon inf --seeds 5 --epochs 50 \
		--jobs 2 --synthetic-nodes 2708 --in-process --out $(DEGRADATION_OUT)

# docs/results.md from scratch: the privacy-utility grid (VESPER's findings a-d under both
# accounting modes) and the audit, on Cora and Tolokers (resumable;
# delete docs/results/ to start over). results-quick: the small grid, under 10 minutes.
results: $(STAMP)
	$(BIN)/vesper bench results --jobs 2

results-quick: $(STAMP)
	$(BIN)/vesper bench results --quick --jobs 2 --out bench/results-quick --report bench/results-quick.md

# 20,000 training steps through the three services; RSS, open file descriptors and threads
# of each, flat and leak-free or exit 6 (docs/soak.md; about 10-25 minutes on 2 cores)
bench-soak: $(STAMP)
	nice -n 10 $(BIN)/vesper bench soak --steps 20000

# issue #9's figures, each a ratio measured in this one run: two-party throughput against one
# process, pipelining, sampler and PMP layer against their references, wire bytes, accountant
# latency, scale; writes docs/performance.md (run it on a quiet machine)
bench-perf: $(STAMP)
	$(BIN)/vesper bench perf --tolokers $(TOLOKERS) --out docs/performance.md \
		$(if $(wildcard $(PEER_ENV)/bin/python),--peer-env $(PEER_ENV))

# DGL 2.1 and its torch 2.1 in a side environment, only to be measured against: the sampler
# figure of bench-perf times DGL there in the same run (without it, DGL is not measured).
# About 5 GB: PyPI's torch 2.1 brings its CUDA libraries. Never imported by vesper.
PEER_ENV ?= .peer-env
bench-peer:
	test -x $(PEER_ENV)/bin/python || $(PYTHON) -m venv $(PEER_ENV)
	# PIP_CONSTRAINT empty: this machine's pip caps torch for vesper's own environment, not this one
	PIP_CONSTRAINT= $(PEER_ENV)/bin/python -m pip install --quiet "torch==2.1.2" "dgl==2.1.0" "torchdata==0.7.1" \
		"numpy<2" "pandas<2.3" pyyaml pydantic
	$(PEER_ENV)/bin/python -c "import dgl, torch; print('peer environment:', 'DGL', dgl.__version__, 'torch', torch.__version__)"

# vesper and its dependencies but torch as wheels, for a host with no package index (the GPU
# check below; air-gapped hosts). PYTHON_VERSION: the target's python (the GPU machines': 3.12)
PYTHON_VERSION ?= 3.12
wheelhouse: $(STAMP)
	deploy/wheelhouse.sh $(PYTHON_VERSION)

# on a machine with one NVIDIA GPU and its own python with a CUDA torch (no package index
# needed: bring .wheelhouse/): the CUDA-marked tests and CPU-against-CUDA figures, one table,
# under 8 minutes. The dry run does the same here with the CPU standing in (docs/performance.md)
gpu-check:
	deploy/gpu-check.sh

gpu-check-dry-run: $(STAMP)
	deploy/wheelhouse.sh $$($(BIN)/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
	deploy/gpu-check.sh --dry-run

proto: $(STAMP)
	$(BIN)/python -m vesper.proto.generate

check-proto: $(STAMP)
	$(BIN)/python -m vesper.proto.generate --check

clean:
	rm -rf $(VENV) .vesper .pytest_cache .hypothesis *.egg-info .wheelhouse
