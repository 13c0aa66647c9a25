# Stable interface of the project: others script against these target names.
SHELL := /bin/bash
SANDBOX := containers/sandbox/sandbox.sh
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test typecheck unit e2e contract pyslurm bench bench-scale bench-hold image lint sandbox-up sandbox-down sandbox-status sandbox-env bridge-up bridge-deploy bridge-down venv

sandbox-up:      ## start real Slurm + real Kubernetes on this machine
	@$(SANDBOX) up

sandbox-down:    ## stop the sandbox and delete its state (the build cache stays)
	@$(SANDBOX) down

sandbox-status:  ## show every sandbox daemon and the nodes
	@$(SANDBOX) status

sandbox-env:     ## print exports: eval "$(make -s sandbox-env)"
	@$(SANDBOX) env

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

lint: venv
	$(VENV)/bin/ruff check bridge tests

typecheck: venv  ## mypy over bridge/ (settings in pyproject.toml)
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/pytest -q tests/unit

e2e: venv sandbox-up
	$(VENV)/bin/pytest -q -m e2e tests/e2e

test: venv sandbox-up  ## lint, type check, unit tests, then e2e tests on the sandbox
	$(VENV)/bin/ruff check bridge tests
	$(VENV)/bin/mypy
	@# The unit tests and the e2e tests that share the cluster run three at a time (whole modules);
	@# then, one at a time, the e2e tests that restart the daemon, change the cluster or measure it.
	@# The second phase runs even when the first failed: one run reports every failure.
	status=0; \
	$(VENV)/bin/pytest -q --durations=15 -n 3 --dist loadfile -m "not e2e or shares_the_cluster" tests || status=$$?; \
	$(VENV)/bin/pytest -q --durations=60 -m "e2e and not shares_the_cluster" tests || status=$$?; \
	exit $$status

demo: venv sandbox-up
	@containers/sandbox/demo.sh

bridge-up: venv sandbox-up  ## start the bridge daemon, its slurmds and job_submit.lua on the sandbox
	@containers/bridge/up.sh

bridge-deploy: venv sandbox-up  ## the bridge as its 2-replica Deployment: helm upgrade --install of deploy/helm/slurm-k8s-bridge
	@containers/bridge/deploy.sh

bridge-down:     ## stop the bridge (host daemon or Deployment) and the bridged nodes' slurmds
	@containers/bridge/down.sh

pyslurm: sandbox-up  ## build pyslurm (+ the bridge's extension) into the Slurm rootfs
	@containers/pyslurm/build.sh >/dev/null

contract: venv sandbox-up  ## the SlurmClient contract, against slurmrestd and pyslurm
	$(VENV)/bin/pytest -q tests/contract

bench: venv bridge-up  ## latency numbers on the sandbox (prints, asserts nothing)
	PYTHONPATH=. $(VENV)/bin/python bench/latency.py
	PYTHONPATH=. $(VENV)/bin/python bench/kubelet_start.py

bench-scale: venv bridge-up  ## an array of many short jobs, bridged and native (prints; last line JSON)
	PYTHONPATH=. $(VENV)/bin/python bench/scale.py

bench-hold: venv bridge-up  ## thousands of sim jobs queued, hundreds running: the bridge's footprint (prints; last line JSON)
	PYTHONPATH=. $(VENV)/bin/python bench/hold.py

image: sandbox-up  ## build the daemon's image (no Docker) and import it into the sandbox's real nodes
	@containers/images/bridge-image.sh
