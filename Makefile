# Two entry points do all set-up on a fresh machine:
#   make bench   - the benchmark against the embedded Triton (the main job)
#   make test    - the test suite against a real Triton and a real local Ray
# Both create .venv (library, numpy 2, Ray) and .triton-env (the server side: tritonserver
# from nvidia-pytriton with numpy<2, which its Python backend needs).
PYTHON ?= python3
VENV := .venv
export RAY_TRITON_SHM_SERVER_ENV ?= $(CURDIR)/.triton-env

.PHONY: bench test newcomer serve lint docs browser clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[ray,bench,dev]"
	$(VENV)/bin/ray-triton-shm setup-server
	touch $@

# Every example model on every path, then the open loop on the online-serving case (one image
# a request); writes bench-results/report.html (open it), bench.json, and the figures.
bench: $(VENV)/.installed
	$(VENV)/bin/ray-triton-shm bench --ray --json bench-results/bench.json \
		--plot bench-results/bench.png --report bench-results/report.html \
		--request-rate 50% 100% 150% --latency-bound-ms 50 \
		--rate-models classifier-1 $(BENCH_ARGS)

test: $(VENV)/.installed browser
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

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

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .triton-env site
