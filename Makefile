# podsnap — every entry point. `make demo` and `make test` are the two commands of the README.
SHELL := /bin/bash
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
export PATH := $(ROOT)/.tools/bin:$(ROOT)/.venv/bin:$(PATH)
PY := $(ROOT)/.venv/bin/python
PYTEST := $(PY) -m pytest
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: help setup setup-python setup-demo lint fmt test test-unit test-chart test-engine test-operator test-e2e \
        overlays demo bench-gpu cluster-up cluster-down kind-up kind-down images images-push clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup: ## install every tool the tests need (idempotent; slow builds cached in ~/.cache/podsnap)
	@$(ROOT)/hack/setup.sh

setup-python: ## only the Python environment and the downloaded tools (no Kubernetes/CRIU builds)
	@$(ROOT)/hack/setup.sh --no-kubernetes --no-criu

lint: setup-python ## ruff (lint + format check), mypy, and the import layers of .importlinter
	$(PY) -m ruff check python tests bench hack
	$(PY) -m ruff format --check python tests bench hack
	$(PY) -m mypy
	$(ROOT)/.venv/bin/lint-imports --no-cache $(ROOT)/.importlinter

fmt: setup-python ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix python tests bench hack
	$(PY) -m ruff format python tests bench hack

test: setup lint cluster-up ## the whole suite: lint, unit, chart, engine, operator, e2e on the local cluster
	$(PYTEST) $(PYTEST_ARGS)

test-unit: setup-python ## unit tests only
	$(PYTEST) tests/unit $(PYTEST_ARGS)

test-chart: setup ## chart lint/render/schema/upgrade tests and an install into a real apiserver
	$(PYTEST) tests/chart $(PYTEST_ARGS)

overlays: setup-python ## regenerate overlays/base from the chart
	$(PY) $(ROOT)/hack/gen_overlays.py

test-engine: setup ## real CRIU capture -> restore of the demo worker (CPU)
	$(PYTEST) tests/engine $(PYTEST_ARGS)

test-operator: setup ## operator + agent against a real etcd + kube-apiserver + controller-manager
	$(PYTEST) tests/operator tests/agent $(PYTEST_ARGS)

test-e2e: setup cluster-up ## the user's flow on the local single-node Kubernetes
	$(PYTEST) -m cluster tests/e2e $(PYTEST_ARGS)

setup-demo: ## only what `make demo` uses: the Python environment and CRIU (no Kubernetes, no test tools)
	@$(ROOT)/hack/setup.sh --demo

demo: setup-demo ## capture -> restore -> request of the demo worker on this host, with a timing table
	$(ROOT)/.venv/bin/podsnap demo $(DEMO_ARGS)

bench-gpu: ## on the GPU machine: cold start vs restore at 8 and 32 GiB, eager/compiled, transparent/cooperative, JSON out
	$(ROOT)/bench/run-gpu.sh

cluster-up: setup ## a real single-node Kubernetes on this machine (containerd, kubelet, local images)
	$(ROOT)/hack/cluster/up.sh

cluster-down: ## stop the local cluster (WIPE=1 to also remove its state)
	$(ROOT)/hack/cluster/down.sh $(if $(WIPE),--wipe,)

images: setup ## build the operator, agent and demo images (no Docker needed); one archive each in out/images
	$(ROOT)/hack/images.sh export

images-push: ## push the images of `make images` with skopeo: make images-push REGISTRY=host[:port]/path
	$(ROOT)/hack/images.sh push $(REGISTRY)

kind-up: ## on a host with Docker + NVIDIA container toolkit: kind cluster with GPU passthrough
	$(ROOT)/hack/kind/up.sh

kind-down: ## delete the kind cluster
	$(ROOT)/hack/kind/down.sh

clean: ## remove the project-local environment (not the per-user cache)
	rm -rf $(ROOT)/.venv $(ROOT)/.tools
