# The two commands of the README: `make run` (the main job) and `make test` (everything CI checks).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: bootstrap run test test-midnight test-at lint typecheck unit build bench-ring bench-api bench-agent bench-catchup bench-ingest bench-e2e bench-ebpf bench-probe bench-cupti bench-kql bench-derive bench-import bench-metrics bench-rules bench-ui bench-histogram-core bench-histogram bench-histstore bench-samplestore bench-timeline bench-calls bench-routing bench-backup bench-cli soak clean
.PHONY: bench-fleet bench-fleet-gpus bench-fleet-inproc bench-fleet-ingest bench-fleet-matching

bootstrap:
	@scripts/bootstrap.sh

# Rebuild the compiled parts in place after C changes (pip install -e builds them once); bootstrap
# re-links the strict editable install when modules were added or removed (docs/architecture.md).
build: bootstrap
	@$(PY) setup.py -q build_ext --inplace 2>&1 | grep -v "^running" || true

run: build
	$(PY) -m kernel_insight.cli run

lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The second run checks the SDK distribution from its own link tree (sdk/build/__editable__...), where
# its modules sit at kernel_insight.sdk.* (the main tree no longer holds them: docs/architecture.md).
typecheck: bootstrap
	$(VENV)/bin/mypy
	cd sdk/build/__editable__.kernel_insight_sdk-*/ && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml \
		--explicit-package-bases --cache-dir $(CURDIR)/.mypy_cache/sdk kernel_insight/sdk

# Test workers (pytest-xdist; tests/conftest.py says what runs together): most of a test's time is
# spent waiting on the processes it starts, so `make test TEST_WORKERS=4` (more workers than cores)
# runs the suite in parallel. The default stays one process until a parallel run on a quiet machine
# has shown every test holds (bench/results/test-suite.md).
TEST_WORKERS ?= 0

unit: build
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Prints its own wall time at the end (docs/benchmarks.md keeps the figure).
test:
	@start=$$(date +%s); rc=0; $(MAKE) --no-print-directory lint typecheck unit || rc=$$?; \
	s=$$(( $$(date +%s) - start )); echo "make test: $$((s / 60)) min $$((s % 60)) s (exit $$rc)"; exit $$rc

# The tests (TESTS, default: those that read the wall clock) each started LEAD (default 6)
# seconds before the next UTC midnight, only the wall clock moved: day-boundary bugs.
test-midnight: build
	scripts/test_at_time.sh $(or $(LEAD),6) $(TESTS)

# The same at each UTC time of day in AT (e.g. AT=03:30,00-08:00:05,01-08:00:00-4; see
# scripts/test_at_time.sh): fixtures placing data hours before "now" cross a day elsewhere.
test-at: build
	PYTEST_ARGS='$(PYTEST_ARGS)' scripts/test_at_time.sh $(AT) $(TESTS)

bench-ring: build
	$(PY) -m bench.ring

bench-cli: build
	$(PY) -m bench.cli

bench-api: build
	$(PY) -m bench.api

bench-timeline: build
	$(PY) -m bench.timeline

bench-calls: build
	$(PY) -m bench.calls

bench-agent: build
	$(PY) -m bench.agent

bench-catchup: build
	$(PY) -m bench.agent --catchup --agents 2 --rate 2000 --outage 30

bench-ingest: build
	$(PY) -m bench.ingest

# Real ki collector + 8 ki-agents fed by C producers; a rate search bounded to 10 minutes.
bench-e2e: build
	$(PY) -m bench.e2e

# GPU fleet (issue 34): recorded real agent batches replayed for N agents into one collector with
# the shipped rules and 10,000 instances in the health snapshot; a sweep bounded by --gpus/--seconds.
bench-fleet-gpus: build
	$(PY) -m bench.fleet.gpus

bench-routing: build
	$(PY) -m bench.routing

bench-ebpf: build
	$(PY) -m bench.ebpf

bench-probe: build
	$(PY) -m bench.probe

# The CUPTI probe with the stand-in CUPTI: ns and instructions (callgrind) per activity record in its
# buffer-completed path, and its resident memory beside a workload (docs/probes.md).
bench-cupti: build
	$(PY) -m bench.cupti

# Node_exporter fleets by remote_write and alert rules as instant queries into kql, Prometheus 2.x/3.x and
# VictoriaMetrics, one at a time (docs/benchmarks.md "fleet"); FLEET_ARGS="--targets 100,250 --seconds 120".
bench-fleet: build
	$(PY) -m bench.fleet $(FLEET_ARGS)

# bench-fleet's alert round in one process: N targets' series in a collector head, the 35 alert
# expressions timed as instant queries (CPU per expression); FLEET_INPROC_ARGS="--targets 500".
bench-fleet-inproc: build
	$(PY) -m bench.fleet.inproc $(FLEET_INPROC_ARGS)

# bench-fleet's remote_write ingest in one process (decode, prepare, group insert, head): CPU per
# sample of new and of known series; FLEET_INGEST_ARGS="--targets 500 --churn 10".
bench-fleet-ingest: build
	$(PY) -m bench.fleet.ingest $(FLEET_INGEST_ARGS)

# The head's series selection alone (Head.matching): snapshot-like selectors over 207,500 series,
# postings path vs as answered; FLEET_MATCHING_ARGS="--instances 10000 --metrics 20".
bench-fleet-matching: build
	$(PY) -m bench.fleet.matching $(FLEET_MATCHING_ARGS)

bench-kql: build
	$(PY) -m bench.kql

bench-derive: build
	$(PY) -m bench.derive

bench-import: build
	$(PY) -m bench.importing

bench-backup: build
	$(PY) -m bench.backup

# An hour of mixed load with a fault every 5 minutes (bench/soak); SOAK_ARGS='--minutes 10 --seed 2'.
soak: build
	$(PY) -m bench.soak $(SOAK_ARGS)

bench-metrics: build
	$(PY) -m bench.metrics

bench-rules: build
	$(PY) -m bench.rules

# The web UI in Debian's chromium: fleet page first paint with 1,000 instances.
bench-ui: build
	$(PY) -m bench.ui

bench-histogram-core: build
	$(PY) -m bench.histogram

# Kernel histograms end to end: agent ns per kernel at 1M/s, VmHWM with 10k kernel names, wire
# bytes per GPU-second at 100k/s (C producer -> ki-agent -> ki collector), kql quantile vs classic.
bench-histogram: build
	$(PY) -m bench.histogram.pipeline

# Native histograms on disk: bytes per histogram sample for each codec choice (docs/storage.md).
bench-histstore: build
	$(PY) -m bench.histstore

# Float samples on disk: bytes per sample per column for each codec, sort key and granularity
# tried, on bench-ingest's, bench-import's and bench-e2e's data (docs/storage.md, "Codecs").
bench-samplestore: build
	$(PY) -m bench.samplestore

clean:
	rm -rf build $(VENV) *.egg-info
	find . -name '*.so' -path './agent/*' -delete
	rm -rf agent/bin
