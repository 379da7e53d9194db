# provisioner developer entry points. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python

.PHONY: help deps venv test test-unit test-integration lint demo demo-vllm clean

help:
	@echo "make deps       install the Debian packages the suite needs (root or sudo)"
	@echo "make venv       create .venv with the first Python >= 3.12 found (PATH, then pyenv)"
	@echo "make test       the whole suite: unit, integration, two rack lanes, vLLM side by side (root needed for the rack)"
	@echo "make test-unit  unit tests only (in-process: no subprocess, network, root or rack; under 2 minutes)"
	@echo "make test-integration  real ansible-playbook/ansible-runner, lint, wheel, galaxy (no root, no rack)"
	@echo "make lint       ansible-lint (production profile) + yamllint"
	@echo "make demo       bring up the simulated rack and provision it (GPU stack, fabric, firewall)"
	@echo "make demo-vllm  3 nodes with the CPU vLLM image serving two vLLM clusters, behind a balancer host"

deps:
	@./.ci/install-deps.sh

$(PY):
	@./.ci/find-python.sh >/dev/null || exit 1
	@set -e; P=$$(./.ci/find-python.sh); echo "using $$P"; $$P -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'

venv: $(PY)

test: deps venv
	PYTEST=$(VENV)/bin/pytest ./.ci/test-suites.sh

test-unit: venv
	$(VENV)/bin/pytest tests/unit

test-integration: venv
	$(VENV)/bin/pytest tests/integration

# what CI lints (tests/integration/test_lint.py runs this target); --offline: requirements.yml names the collection
# tarball that only the execution-environment build creates, so ansible-lint must not try to install it
LINT_TARGETS := playbooks roles galaxy.yml meta execution-environment.yml requirements.yml
lint: venv
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint --profile production --offline --nocolor $(LINT_TARGETS)
	$(VENV)/bin/yamllint --strict --format parsable $(LINT_TARGETS) inventories

# The racks' inventories vault their secrets (the vLLM API key, the BMC password) with this machine's testbed vault
# password (provisioner_testbed/vault.py): provision and ansible-playbook find it as a site's, through the environment.
TESTBED_VAULT ?= $(or $(PROVISIONER_TESTBED_STATE),/var/lib/provisioner-testbed)/vault-password
demo demo-vllm: export ANSIBLE_VAULT_PASSWORD_FILE = $(TESTBED_VAULT)

# The plain rack has no vLLM image, so its inventory declares no vLLM cluster: a plain run (and the nightly drift)
# of it is clean. `make demo-vllm` adds the CPU vLLM golden layer and its clusters.
demo: deps venv
	$(VENV)/bin/provision testbed up --nodes 4
	$(VENV)/bin/provision run inventories/testbed/hosts.ini

demo-vllm: deps venv
	$(VENV)/bin/provision testbed up --name demo-vllm --nodes 3 --balancers 1 --with-vllm --spec tests/vllm/rack-spec.yaml
	# onboard = preflight, run without the vLLM launch, health gate, in-service mark, then the (gated) vLLM launch
	$(VENV)/bin/provision onboard inventories/testbed-demo-vllm/hosts.ini node01 node02 node03 --serial 3
	# the serving edge: nginx on lb01 in front of both clusters (port 8000, the API key passed through)
	$(VENV)/bin/provision run inventories/testbed-demo-vllm/hosts.ini --limit lb

clean:
	rm -rf $(VENV) .pytest_cache
