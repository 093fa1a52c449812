# Set-up-and-go targets. Each installs what it needs on a fresh machine (Java, the venv, the
# pinned packages) before it runs; re-running skips what is already installed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup lint demo demo-engine ui test bench bench-recovery bench-console bench-kafka bench-rescale bench-open bench-lookup bench-commit bench-expressions bench-tpch bench-upgrade clean
setup: $(STAMP)

$(STAMP): pyproject.toml infra/setup.sh
	bash infra/setup.sh $(VENV)
	touch $@

demo: setup          ## the shop demo end to end through Dagster (sensor, step runs, checks, checkpoint)
	$(PY) infra/demo.py --fresh

demo-engine: setup   ## the shop demo on the engine alone (no Dagster)
	$(PY) -m dbsp_pipeline demo --root var/demo

ui: setup            ## the operator's console: dagster dev (webserver + daemon) on 127.0.0.1:3000
	bash infra/dagster.sh run

lint: setup          ## ruff (style and common bugs) and mypy --strict on the package
	$(PY) -m ruff check .
	$(PY) -m mypy

test: setup lint     ## the checks, then the whole test suite
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup         ## the engine benchmark: incremental steps vs Spark recomputation
	$(PY) benchmarks/engine_bench.py $(BENCH_ARGS)

bench-recovery: setup  ## checkpoint cost vs state size, recovery time vs uncommitted steps
	$(PY) benchmarks/recovery_bench.py $(BENCH_ARGS)

bench-console: setup  ## sensor-to-view latency through Dagster: local Spark vs a Spark Connect server
	$(PY) benchmarks/console_latency.py $(BENCH_ARGS)

bench-kafka: setup    ## records/s through Kafka (pass-through, join+aggregate) vs the raw broker
	$(PY) benchmarks/kafka_bench.py $(BENCH_ARGS)

bench-rescale: setup  ## rescale: state rows moved and rewritten per sharding function; cold vs hot seconds and step pauses
	$(PY) benchmarks/rescale_bench.py $(BENCH_ARGS)

bench-open: setup     ## open and status seconds, _divisions files and _delta_log entries after 10 / 1,000 / 10,000 tiny steps
	$(PY) benchmarks/open_bench.py $(BENCH_ARGS)

bench-commit: setup   ## what one delta-rs commit and the log read after it cost here (the floor of a durable action)
	$(PY) benchmarks/delta_commit_bench.py $(BENCH_ARGS)

bench-expressions: setup   ## a small driver step with date and string functions in DuckDB vs the same select as a Spark job
	$(PY) benchmarks/expressions_bench.py $(BENCH_ARGS)

bench-lookup: setup   ## step cost per access pattern (moves, order changes, max deletes, two big inputs) at 1M/4M/16M orders vs DuckDB and Spark recompute; writes docs/bench/lookup.png
	$(PY) benchmarks/lookup_bench.py $(BENCH_ARGS)

bench-upgrade: setup  ## change one view of five in a loaded pipeline (4M orders): upgrade vs rebuilding it vs DuckDB
	$(PY) benchmarks/upgrade_bench.py $(BENCH_ARGS)

bench-tpch: setup     ## TPC-H at scale factor 1: per query, RF1+RF2 refresh seconds vs DuckDB and Spark recomputing it
	$(PY) benchmarks/tpch_bench.py $(BENCH_ARGS)

clean:
	rm -rf var .pytest_cache .hypothesis
