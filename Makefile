# hvdtrain: the two commands the README promises.
#   make demo   set up (idempotent) and train the image recipe on 2 ranks, torch and TensorFlow, on MNIST
#   make test   set up (idempotent) and run the whole test suite in two pytest workers (TEST_WORKERS=0: in one process)
#   make test-fast   set up (idempotent) and run the fast lane: unit tests and the in-process Trainer tests (under 3 minutes)
#   make docs   build the documentation site into docs/_build/html (Sphinx, warnings as errors)
#   make docker-cpu   build the CPU image hvdtrain:cpu (scripts/docker-build.sh; docs/guides/docker.md)
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
NP ?= 2
DEMO_OUT ?= runs/demo
PYTEST_ARGS ?=
# make test runs its modules in this many pytest-xdist workers, a module whole in one, longest first (tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: setup demo demo-torch demo-tensorflow test test-unit test-fast docs bench clean docker-cpu docker-gpu test-cluster gpu-wheel

setup:
	bash scripts/install.sh

demo: setup
	bash scripts/demo.sh $(NP) $(DEMO_OUT)

test: setup
	$(PY) -m pytest tests -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

# no horovodrun job: tests/unit plus the Trainer's rules run in-process on a NumPy adapter (tests/fast),
# in the same pytest-xdist workers as make test
test-fast: setup
	$(PY) -m pytest tests/unit tests/fast -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# the benchmark suite (about 12 minutes on 2 cores; not part of test): BENCHMARKS.md + benchmarks/benchmarks.png
bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf $(DEMO_OUT) .pytest_cache

# the CPU image with this machine's pip set-up, reusing the Horovod wheel that `make setup` built
DOCKER_TAG ?= hvdtrain:cpu
docker-cpu:
	bash scripts/docker-build.sh $(DOCKER_TAG)

# the GPU image (docker/Dockerfile.gpu): CUDA, NCCL and nvcc from PyPI's NVIDIA wheels, Horovod built with NCCL
GPU_DOCKER_TAG ?= hvdtrain:gpu
docker-gpu:
	bash scripts/docker-build.sh -f docker/Dockerfile.gpu $(GPU_DOCKER_TAG)

# the multi-host tests alone (containers as hosts; builds the image if needed)
test-cluster: setup
	$(PY) -m pytest tests/cluster -ra $(PYTEST_ARGS)

# Horovod with NCCL for a lent GPU machine's stack (Python 3.12, torch 2.11.0+cu130, sm_90), built on this
# CPU machine into .gpu/ with the wheels that machine lacks (docs/guides/gpus.md; benchmarks/gpu/device.sh runs there)
gpu-wheel:
	bash scripts/gpu-wheel.sh .gpu

# the documentation site (Sphinx, the docs extra) into docs/_build/html; the generated reference pages
# (docs/generate.py: config keys, the rulebook's table) are rewritten first; warnings are errors
docs: setup
	$(PY) docs/generate.py
	$(PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html
