# One-command set-up: `make train` trains DLRM on the generated default data,
# `make test` runs the test suite (`make test-fast`: the tests that start no process).
# Both install into .venv first (idempotent); `make check` runs the linter, formatter
# and type checker.
# STACK picks the torch/FBGEMM/torchrec releases: a folder of stacks/ (its pins), default
# the one stacks/default names. Any other stack gets a venv of its own:
# `make test-fast STACK=torch2.14` installs into and tests .venv-torch2.14.
DEFAULT_STACK := $(file < stacks/default)
STACK ?= $(DEFAULT_STACK)
VENV ?= $(if $(filter $(DEFAULT_STACK),$(STACK)),.venv,.venv-$(STACK))
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= data_cache/synthetic_criteo
NPROC ?= 2
# Its optimizer flags are the ones a run diverging with the public defaults advises
# (training/recipes.py STABLE_OPTIMIZER; tests/training/test_recipes_first_steps.py ties the two).
TRAIN_FLAGS ?= --batch_size 512 --epochs 1 --learning_rate 0.05 --optimizer adagrad \
	--validation_freq_within_epoch 400 --log_every_n_steps 100 --seed 0 \
	--log_path runs/make_train.jsonl

.PHONY: check release-tag wheelhouse install native-data data train train-dcnv2 sweep-example docs-figures slurm-up cluster-up cluster-down test test-cluster test-multihost test-native test-loop test-gpu-host test-bench test-faults test-zch test-fast test-hostile test-matrix bench serving-cpp clean

install: $(STAMP) native-data

# The Parquet loader's compiled column kernels (data/parquet/kernel.py), built into the
# source tree (git-ignored) with the system C compiler; without one the loader converts
# with numpy (docs/data.md). Needs no venv: `make native-data` alone rebuilds them.
NATIVE_DATA := data/parquet/native/libdlrm_columns.so
native-data: $(NATIVE_DATA)

$(NATIVE_DATA): data/parquet/native/columns.c data/parquet/native/id_hash.h scripts/build_native_data.sh
	CC=$(CC) bash scripts/build_native_data.sh

# The project's packages are installed editable: a new package folder reinstalls.
$(STAMP): requirements.txt requirements-dev.txt $(wildcard stacks/$(STACK)/*) pyproject.toml \
          scripts/install.sh scripts/check_install.py $(wildcard */__init__.py)
	STACK=$(STACK) bash scripts/install.sh $(VENV)
	touch $@

# The standard checks, with the versions requirements-dev.txt pins (make install puts
# them in the venv): lint and import order, format, types (pyproject.toml configures all
# three; docs/tests.md, "Checks"), then the tests of the house itself: its layers, import
# circles and first imports (tests/test_architecture.py) and the tools' own tests
# (tests/test_checks.py), which make test leaves to it. Any finding fails it; .ci/run
# runs it first.
HOUSE_TESTS := tests/test_architecture.py tests/test_checks.py
check: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) $(HOUSE_TESTS)

# Tags HEAD vX.Y.Z, its release (common/version.py's, CHANGELOG.md's newest heading);
# refuses uncommitted changes and a version already tagged (scripts/release_tag.py).
release-tag:
	python3 -m scripts.release_tag tag

# An offline install's wheels: every wheel the project needs beyond a host's own torch
# (FBGEMM's CUDA build trimmed to GPU_ARCH, torchrec, the runtime packages), within
# 60 MiB, for Python PYTHON_VERSION on manylinux x86_64; then, on the host,
# `scripts/install.sh --wheelhouse DIR --system-torch` (docs/launching.md). Runs with
# this host's python3 and pip, not the venv's. WHEELHOUSE_DEVICE=cpu: the stack's CPU
# build; FBGEMM_WHEEL: a downloaded FBGEMM wheel instead of downloading it again.
WHEELHOUSE ?= wheelhouse
GPU_ARCH ?= sm_90
PYTHON_VERSION ?= 3.12
WHEELHOUSE_DEVICE ?= cuda
wheelhouse:
	python3 scripts/wheelhouse.py build --stack $(STACK) --device $(WHEELHOUSE_DEVICE) \
		$(if $(CUDA_VARIANT),--cuda-variant $(CUDA_VARIANT)) --gpu-arch $(GPU_ARCH) \
		--python-version $(PYTHON_VERSION) --output $(WHEELHOUSE) \
		$(if $(FBGEMM_WHEEL),--fbgemm-wheel $(FBGEMM_WHEEL)) $(if $(TORCH_INDEX),--torch-index $(TORCH_INDEX))

data: install
	$(PYTHON) -m data.synthetic_criteo --output_dir $(DATA_DIR) --seed 0

train: data
	$(PYTHON) -m training.launch --standalone --nproc_per_node $(NPROC) dlrm_main.py \
		--in_memory_binary_criteo_path $(DATA_DIR) $(TRAIN_FLAGS)

train-dcnv2: data
	$(PYTHON) -m training.launch --standalone --nproc_per_node $(NPROC) dcnv2_main.py \
		--in_memory_binary_criteo_path $(DATA_DIR) $(TRAIN_FLAGS) \
		--embedding_dim 64 --dense_arch_layer_sizes 256,64 --over_arch_layer_sizes 256,128,1 \
		--dcn_low_rank_dim 128

# The README's table-size sweep (4 short runs through torchx local_cwd, a few minutes).
sweep-example: data
	$(PYTHON) -m sweeps run examples/sweeps/table_sizes.yaml

# Every figure in docs/ from the command that draws it (scripts/docs_figures.py lists
# them): the sweep above, a plan chart, a DLRM and a DCNv2 run's training.report.
docs-figures: data
	$(PYTHON) -m scripts.docs_figures

# A one-node Slurm cluster with accounting on this machine (root; docs/slurm.md).
slurm-up:
	bash scripts/slurm_up.sh

# Several hosts on this machine: network namespaces on a private bridge, a hostname
# each, and a Slurm cluster across them (root; docs/multihost.md, docs/slurm.md).
# CLUSTER_HOSTS=4 for more; cluster-down removes them.
CLUSTER_HOSTS ?= 3
cluster-up:
	bash scripts/cluster_up.sh --hosts $(CLUSTER_HOSTS)

cluster-down:
	bash scripts/cluster_up.sh --down

# Two pytest-xdist workers, whole files each: a test's processes wait on process
# start-up, rendezvous and I/O, which the other worker fills (13m22s -> 9m42s here).
# The files go out in tests/conftest.py's order (the most slow tests first), not xdist's.
TEST_WORKERS ?= 2
test: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not multihost and not native and not cluster and not gpu_host and not loop and not bench and not faults and not zch" $(HOUSE_TESTS:%=--ignore=%) tests

# The tests on the one-node Slurm cluster (make slurm-up, as root): one process, since
# their jobs share the node's CPUs and would only queue behind each other. Out of make
# test's 15 minutes (docs/tests.md); .ci/run runs them after make test.
test-cluster: install
	$(PYTHON) -m pytest -q -m cluster tests

# The tests on the multi-host cluster (make cluster-up, as root): one process, since they
# take the cluster in turn (tests/support/cluster.py's lock) and would only keep a second
# worker waiting. .ci/run runs them after make test.
test-multihost: install
	$(PYTHON) -m pytest -q -m multihost tests

# What compiles native code (AOTInductor packages, serving/cpp's program, --compile's
# Inductor kernels): out of make test's 15 minutes; .ci/run runs it after make test
# (docs/tests.md).
test-native: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m native tests

# The daily loop run day by day (python -m training.daily: a training, export, gate and
# promote subprocess per day) and its warm starts' launches, about 3 minutes: outside
# make test's 15 minutes.
test-loop: install
	$(PYTHON) -m pytest -q -m loop tests

# The CPU rehearsals of a GPU host's session (a wheelhouse built from PyPI and installed
# offline, bench.gpu_session's steps): 2 minutes each, out of make test's 15 minutes;
# .ci/run runs them after make test (docs/tests.md).
test-gpu-host: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m gpu_host tests

# Runs killed or starved on purpose (a rank killed mid-save, torchrun restarting a
# killed rank, SIGTERM while saving, a full disk): out of make test's 15 minutes; .ci/run
# runs them after make test.
test-faults: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m faults tests

# zch's end-to-end runs: torchrec's managed-collision tables trained on 2 gloo ranks,
# resumed, warm-started, exported and served (about 2 minutes of make test's budget).
test-zch: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m zch tests

# The benchmarks' own runs at tiny sizes (bench/quality.py's models on a MovieLens
# subset from PyPI): out of make test's 15 minutes; .ci/run runs them after make test.
test-bench: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m bench tests

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" tests

# The generated hostile-input suites with more cases than make test's (10 of each kind of lie).
HOSTILE_EXAMPLES ?= 200
test-hostile: install
	HOSTILE_EXAMPLES=$(HOSTILE_EXAMPLES) $(PYTHON) -m pytest -q tests/checkpoints/test_checkpoints_hostile.py tests/serving/test_model_files_hostile.py

# The correctness matrix over every triple of choices; MATRIX_STRENGTH=2 covers every
# pair, what .ci/run runs on every stack after the suite (out of make test's 15 minutes).
# A hang stops it (exit 124) instead of waiting out gloo's 30-minute collective timeout
# in every case: every pair takes about 1.5 minutes quiet, every triple 3.5 to 8.5.
MATRIX_STRENGTH ?= 3
MATRIX_TIMEOUT ?= 1800
test-matrix: install
	timeout --kill-after 30 $(MATRIX_TIMEOUT) $(PYTHON) -m harness.matrix --strength $(MATRIX_STRENGTH)

bench: install
	$(PYTHON) bench/train_throughput.py

# dlrm_predict, the C++ server of AOTInductor packages (docs/serving.md, "Serving from C++").
serving-cpp: install
	$(MAKE) -C serving/cpp PYTHON=$(abspath $(PYTHON))

clean:
	rm -rf data_cache runs
