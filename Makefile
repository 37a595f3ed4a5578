# One way to install, one way to test. Every target sets up what it needs first.
#   make demo         run Sluice's main job locally on embedded defaults (sluice-local demo)
#   make test         the whole test suite (unit, integration, e2e), on two workers
#   make test-fast    the tests not marked slow (the edit loop, under 3 minutes)
#   make lint         the static checks CI runs (ruff, cfn-lint, sam validate, ASL, checkov)
#   make image-check  build the image's environment from the Dockerfile's own steps, then run it
#   make gpu-deps     resolve the image's GPU dependencies from the registry, check its CUDA
#                     against SageMaker's GPU drivers
#   make bench        the benchmarks in benchmarks/

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# aws-sam-cli and checkov pin their own boto3 and friends: each gets its own environment.
SAM_VENV := .venv-sam
CHECKOV_VENV := .venv-checkov
# the SageMaker Python SDK (examples/sdk/) pulls in mlflow, docker and more: its own, as a user's
SDK_VENV := .venv-sdk
PIP_FLAGS := --quiet --disable-pip-version-check
export SAM_CLI_TELEMETRY := 0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup sdk lint-tools system-packages demo test test-fast test-inventory lint image-check gpu-deps format bench clean

setup: $(VENV)/.installed

# The three packages (container/, functions/, local/) editable, plus the developers' tools. The lock
# pins every transitive version CI installs; torch==2.13.0 is the CPU wheel on disk.
# vLLM's vision/audio companions: text models never import them, and the registry's builds do not
# load against the CPU torch (see container/pyproject.toml).
VISION := torchvision torchaudio torchcodec
PACKAGES := container/pyproject.toml functions/pyproject.toml local/pyproject.toml
$(VENV)/.installed: $(PACKAGES) requirements/dev.txt requirements/main.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -c requirements/main.lock torch==2.13.0
	$(PY) -m pip install $(PIP_FLAGS) -c requirements/main.lock \
	  -e './container[cpu]' -e ./functions -e ./local -r requirements/dev.txt
	$(PY) -m pip uninstall $(PIP_FLAGS) -y $(VISION)
	touch $@

$(SAM_VENV)/.installed: requirements/sam.lock
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install $(PIP_FLAGS) -c requirements/sam.lock aws-sam-cli
	touch $@

$(CHECKOV_VENV)/.installed: requirements/checkov.lock
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install $(PIP_FLAGS) -c requirements/checkov.lock checkov
	touch $@

$(SDK_VENV)/.installed: requirements/sdk.lock
	$(PYTHON) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/pip install $(PIP_FLAGS) -c requirements/sdk.lock sagemaker
	touch $@

sdk: $(SDK_VENV)/.installed

lint-tools: $(SAM_VENV)/.installed $(CHECKOV_VENV)/.installed

# Debian packages the tests use (CI installs them): chromium, for the test that opens the local
# dashboard page headless; tcmalloc, which `sluice serve` preloads on CPU hosts as vLLM's CPU guide
# asks (container/sluice/malloc.py). One apt-get: two in parallel (make -j) fight over its lock.
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
system-packages:
	@{ command -v chromium >/dev/null && ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1; } || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends chromium libtcmalloc-minimal4; }

demo: setup
	$(VENV)/bin/sluice-local demo

# Two pytest-xdist workers: most of the suite's time is single-threaded (process start-up,
# imports, moto), so two of them keep both cores busy. A module's tests stay on one worker and
# share its fixtures (tests/conftest.py). Groups go out in collection order, the long e2e modules
# first (xdist's default reorders them by test count, which left the longest for last).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: setup $(SDK_VENV)/.installed
	@$(PY) -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; fi; exit $$rc

test-fast: setup
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# every test listed in tests/inventory.txt is still collected (the suite never shrinks unseen)
test-inventory: setup
	$(PY) scripts/test_inventory.py

lint: setup lint-tools
	$(PY) scripts/static_checks.py --sam $(SAM_VENV)/bin/sam --checkov $(CHECKOV_VENV)/bin/checkov

# The image's environment, assembled and installed from container/Dockerfile's own COPY and RUN
# lines in a fresh virtualenv (CPU torch instead of CUDA), then smoke-run; plus hadolint.
image-check: setup
	$(PY) scripts/image_check.py

# The image's CUDA environment (requirements/gpu.lock) resolved again from the package registry
# for its platform, and its CUDA checked against the drivers of SageMaker's GPU hosts.
gpu-deps: setup
	$(PY) scripts/gpu_deps_check.py

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(SAM_VENV) $(CHECKOV_VENV) $(SDK_VENV) .venv-image .pytest_cache .ruff_cache .aws-sam build
