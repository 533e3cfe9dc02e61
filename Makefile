# Two entry points do all set-up on a fresh machine:
#   make bench   - the benchmark against the embedded Triton (the main job)
#   make test    - the test suite against a real Triton and a real local Ray
# (and on a machine with an NVIDIA GPU, make test-gpu: the GPU tests that make test skips)
# Both create .venv (library, numpy 2, Ray) and .triton-env (the server side: tritonserver
# from nvidia-pytriton with numpy<2, which its Python backend needs, perf_analyzer from the
# tritonclient wheel of its release, the bench's ceiling, and onnxruntime for the ONNX models
# it serves through that backend: --onnx-via-python).
PYTHON ?= python3
VENV := .venv
export RAY_TRITON_SHM_SERVER_ENV ?= $(CURDIR)/.triton-env

.PHONY: bench test test-soak test-quick test-gpu newcomer serve lint docs browser prometheus grafana clean

# Again when the server environment's requirements change (ray_triton_shm/local/_install.py).
$(VENV)/.installed: pyproject.toml ray_triton_shm/local/_install.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[ray,bench,dev]"
	$(VENV)/bin/ray-triton-shm setup-server --with onnxruntime
	touch $@

# Every example model on every path (the streaming captioner on its own: 1, 4 and 16 streams,
# Ray tasks and Serve), then the open loop on the online-serving case (one image a request);
# writes bench-results/report.html (open it), bench.json, and the figures.
bench: $(VENV)/.installed
	$(VENV)/bin/ray-triton-shm bench --ray --json bench-results/bench.json \
		--plot bench-results/bench.png --report bench-results/report.html \
		--request-rate 50% 100% 150% --latency-bound-ms 50 \
		--rate-models classifier-1 $(BENCH_ARGS)

test: $(VENV)/.installed browser prometheus
	$(VENV)/bin/python -m pytest -m "not soak" $(PYTEST_ARGS)

# The long tier (the chaos soak, a load swinging 1-32 callers, whole bench runs, whole-cluster
# runs, the property tests of tests/properties/ at 20 times their examples: over 200,000
# inputs; about 18 min), which CI runs after `make test`.
test-soak: $(VENV)/.installed browser prometheus
	RAY_TRITON_SHM_PROPERTIES=soak $(VENV)/bin/python -m pytest -m soak $(PYTEST_ARGS)

# The quick tier, while editing (under a minute): tests/unit/, the logic and the files that
# need no server. One test: make test PYTEST_ARGS="tests/test_client.py -k lease".
test-quick: $(VENV)/.installed
	$(VENV)/bin/python -m pytest tests/unit $(PYTEST_ARGS)

# The GPU tests (tests/test_gpu.py, pools in GPU memory against a real Triton on the GPU, no
# Ray), on a machine with an NVIDIA GPU and its driver; `make test` skips them elsewhere. The
# callers' tensors need torch and cupy in .venv (with the [cuda] extra), the test model needs
# torch in the server environment. The packages suit a driver of CUDA 13; for one of CUDA 12:
# make test-gpu GPU_PACKAGES="torch cupy-cuda12x[ctk] cuda-bindings==12.*"
GPU_PACKAGES ?= torch cupy-cuda13x[ctk]

$(VENV)/.gpu-installed: $(VENV)/.installed
	$(VENV)/bin/python -m pip install --quiet -e ".[cuda]" $(foreach p,$(GPU_PACKAGES),'$(p)')
	$(VENV)/bin/ray-triton-shm setup-server --with torch
	touch $@

# Names the GPU and its driver first, and fails at once, saying why, where no GPU is visible
# (pytest would skip every test and pass).
test-gpu: $(VENV)/.gpu-installed
	-nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	$(VENV)/bin/python -c "from ray_triton_shm import _cuda; print(_cuda.find_device(None))"
	$(VENV)/bin/python -m pytest tests/test_gpu.py $(PYTEST_ARGS)

# A newcomer's path, for real: a wheel of this checkout in a fresh venv with an empty HOME,
# docs/guide/own-model.md step by step (tests/newcomer.py). CI runs it after make test.
newcomer:
	$(PYTHON) tests/newcomer.py

# Headless Chromium (Debian's package) for the tests that look at the bench's report.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { apt-get install -y -qq chromium >/dev/null 2>&1 || \
		    { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; }; } || \
		echo "headless Chromium is missing: install Debian's chromium for the browser tests"

# Prometheus and promtool (Debian's package, 2.42) for the tests of deployments/prometheus/.
# Without its recommends (a node exporter); where systemd started the packaged server (on
# :9090), it is stopped and disabled: the tests run their own.
APT_PROMETHEUS := apt-get install -y -qq --no-install-recommends prometheus
prometheus:
	@{ command -v promtool >/dev/null && command -v prometheus >/dev/null; } || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { $(APT_PROMETHEUS) >/dev/null 2>&1 || \
		    { apt-get update -qq && $(APT_PROMETHEUS) >/dev/null; }; } && \
		  { [ ! -d /run/systemd/system ] || systemctl disable --now prometheus >/dev/null 2>&1 || true; }; } || \
		echo "Prometheus is missing: install Debian's prometheus for the tests of deployments/prometheus"

serve: $(VENV)/.installed
	$(VENV)/bin/ray-triton-shm serve-local --grpc-port 8001 --http-port 8000

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check ray_triton_shm tests deployments
	$(VENV)/bin/ruff format --check ray_triton_shm tests deployments
	$(VENV)/bin/mypy ray_triton_shm

# The documentation site (mkdocs-material, the API reference from the docstrings), built
# strictly: a broken link, reference or docstring fails the build.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(VENV)/bin/python -m pip install --quiet -e ".[docs]"
	touch $@

# Mermaid for the diagrams, served with the site (no CDN: the site renders them offline). npm's
# package, pinned; only its self-contained dist/mermaid.min.js is kept (`npm pack`: no
# dependencies to install). mkdocs.yml loads it on every page, and Material then uses it.
MERMAID_VERSION := 11.17.2
DOCS_JS := .docs-js
MERMAID_JS := docs/assets/javascripts/mermaid.min.js

$(DOCS_JS)/mermaid-$(MERMAID_VERSION).min.js:
	mkdir -p $(DOCS_JS)
	cd $(DOCS_JS) && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null
	tar -xzOf $(DOCS_JS)/mermaid-$(MERMAID_VERSION).tgz package/dist/mermaid.min.js > $@.tmp
	mv $@.tmp $@

$(MERMAID_JS): $(DOCS_JS)/mermaid-$(MERMAID_VERSION).min.js
	mkdir -p $(@D)
	cp $< $@

docs: $(VENV)/.docs-installed $(MERMAID_JS)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The checked-in Grafana dashboard and its ConfigMap, from ray_triton_shm/ray/_dashboard.py.
grafana: $(VENV)/.installed
	$(VENV)/bin/python deployments/grafana/generate.py

clean:
	rm -rf $(VENV) .triton-env site $(DOCS_JS) $(MERMAID_JS)
