# converged.hpc: make lab brings up the lab and runs the main job; make test runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export CONTAINERS_CONF := $(CURDIR)/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
PYTHON ?= python3
SCENARIOS ?= default cluster ha
COLLECTION_LINK := .lab/collections/ansible_collections/converged/hpc
# The real servers (tests/kube, the controllers' smoke test, the lab's workload cluster): the envtest
# convention, kube-apiserver and etcd (and the Cluster API, CAPM3 and Bare Metal Operator managers) in
# $KUBEBUILDER_ASSETS. Unless it is given, `make kube-assets` builds them from their Go modules
# (kube-assets/: go.mod and go.sum only) into ~/.cache/converged-hpc and links them in .lab/kube-assets.
KUBE_ASSETS := $(CURDIR)/.lab/kube-assets
ifeq ($(origin KUBEBUILDER_ASSETS),undefined)
export KUBEBUILDER_ASSETS := $(KUBE_ASSETS)
endif

.PHONY: help deps dev-collection kube-assets lab lab-scale lab-move lab-rebalance lab-down lab-ping lab-status images images-trixie images-bookworm unit lint sanity molecule molecule-22.05 e2e e2e-releases e2e-two e2e-elastic e2e-autoscale e2e-others e2e-converged test build ee

help:
	@sed -n 's/^## //p' Makefile

## make lab        bring up the lab machines and run the main job end to end
# (the lab's management cluster is real: kube-assets builds its servers)
lab: dev-collection kube-assets
	lab/lab.sh deps
	lab/lab.sh up
	lab/lab.sh directory
	lab/lab.sh mgmt
	lab/lab.sh ping
	lab/lab.sh converge
	lab/lab.sh events

## make lab-scale N=5   scale the lab's compute MachineDeployment; with the event path running
##                 (make lab leaves it running) the cluster follows by itself, else it runs
##                 scale_up/scale_down.yml as AWX would
lab-scale: dev-collection
	@test -n "$(N)" || { echo "usage: make lab-scale N=<replicas>"; exit 2; }
	$(PYTHON) lab/scale.py $(N)

## make lab-move FROM=<MachineDeployment> TO=<MachineDeployment> [COUNT=1 | HOSTS=a,b | LABEL=gpu=true]
##                 move hosts of the lab's bare-metal pool (make lab LAB_BARE_METAL=1 LAB_BARE_METAL_GPU=1
##                 LAB_GPU=0 LAB_KUBERNETES_GPU=1: the GPU host a Kubernetes worker), e.g. FROM=clab-k8s-gpu
##                 TO=clab-gpu; make lab-rebalance moves idle hosts to where jobs or Pods wait (DRY_RUN=1: say only)
lab-move: dev-collection
	lab/lab.sh move "$(FROM)" "$(TO)" $(if $(HOSTS),HOSTS=$(HOSTS),$(if $(LABEL),LABEL=$(LABEL),COUNT=$(or $(COUNT),1)))

lab-rebalance: dev-collection
	lab/lab.sh rebalance $(if $(DRY_RUN),-e converged_rebalance_dry_run=true)

## make lab-down   remove every container, network and volume of the lab
lab-down:
	lab/lab.sh down

lab-status:
	@lab/lab.sh status

## make deps       install the Debian and Python packages the lab and tests need (when missing)
deps:
	lab/lab.sh deps
	@# (etcd for the real servers: make kube-assets installs Debian's etcd-server when missing)
	@if ! $(PYTHON) -c 'import pytest, testinfra, molecule, molecule_plugins, antsibull_changelog' 2>/dev/null \
	    || ! command -v ansible-lint >/dev/null || ! command -v ansible-rulebook >/dev/null; then \
	  echo "[deps] pip install -r requirements-test.txt"; \
	  $(PYTHON) -m pip install -q -r requirements-test.txt; \
	fi

dev-collection:
	@mkdir -p $(dir $(COLLECTION_LINK))
	@test "$$(readlink $(COLLECTION_LINK) || true)" = "$(CURDIR)" || ln -sfn $(CURDIR) $(COLLECTION_LINK)

## make images     the lab images: Debian 13 (Slurm 24.11, the default) and Debian 12 (Slurm 22.05)
images: images-trixie images-bookworm

# each release's two images (stock, then prebaked on it), one maker at a time: make test builds Debian 12's
# beside its streams, and only the Slurm 22.05 lab (late in its stream) waits for them
images_of = mkdir -p .lab && flock .lab/images-$(1).lock sh -c 'LAB_SUITE=$(1) lab/lab.sh image stock && LAB_SUITE=$(1) lab/lab.sh image prebaked'
images-trixie:
	$(call images_of,trixie)

images-bookworm:
	$(call images_of,bookworm)

## make kube-assets  build kube-apiserver, the Cluster API, CAPM3 and Bare Metal Operator managers from
##                 their Go modules (cached by version: minutes cold, seconds after), link them and etcd
##                 in .lab/kube-assets ($$KUBEBUILDER_ASSETS)
kube-assets:
	@if [ "$$KUBEBUILDER_ASSETS" = "$(KUBE_ASSETS)" ]; then kube-assets/build.sh "$(KUBE_ASSETS)"; \
	else echo "[kube-assets] KUBEBUILDER_ASSETS=$$KUBEBUILDER_ASSETS (given: nothing built)"; fi

## make unit       unit and integration tests (pytest), on the real servers (make kube-assets)
##                 make kube-assets builds (tests/kube: kube-apiserver, and the controllers' smoke test)
unit: dev-collection kube-assets
	$(PYTHON) -m pytest -q --durations=10 tests/unit tests/integration tests/kube

## make matrix     on each older ansible-core the collection claims (2.16, 2.17, 2.18; MATRIX="2.16" for one),
##                 in venvs of their own: the unit tests, sanity's release-dependent tests, a syntax check of
##                 every playbook (tests/matrix.sh); the releases lab converges on the oldest
matrix: dev-collection kube-assets
	tests/matrix.sh $(MATRIX)

## make lint       ansible-lint (production profile) and ansible-test sanity
lint: dev-collection
	ansible-lint --profile production
	tests/sanity.sh

## make molecule   the molecule scenarios (SCENARIOS="default cluster ha"), one at a time (a lock in .lab)
molecule: dev-collection images-trixie
	@mkdir -p .lab/logs
	for s in $(SCENARIOS); do \
	  flock .lab/molecule.lock molecule test -s $$s 2>&1 | tee .lab/logs/molecule-$$s.log; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	  $(PYTHON) tests/check_secrets.py molecule/$$s/molecule.yml .lab/logs/molecule-$$s.log || exit 1; \
	done

## make molecule-22.05  the cluster scenario on Debian 12 (Slurm 22.05), the older release the
##                 collection supports (the other scenarios and the labs run Debian 13, Slurm 24.11)
molecule-22.05: dev-collection images-bookworm
	@mkdir -p .lab/logs
	MOLECULE_DEBIAN=debian12 flock .lab/molecule.lock molecule test -s cluster 2>&1 | tee .lab/logs/molecule-cluster-22.05.log; \
	  test $${PIPESTATUS[0]} -eq 0
	$(PYTHON) tests/check_secrets.py molecule/cluster/molecule.yml .lab/logs/molecule-cluster-22.05.log

## make e2e        end-to-end lab tests in labs of their own: the elastic lab (the longest) and
##                 the autoscale lab run beside the others; their output is printed at the end
comma := ,
E2E_ELASTIC := tests/e2e/test_elastic.py
E2E_AUTOSCALE := tests/e2e/test_autoscale.py
E2E_RELEASES := tests/e2e/test_releases.py
# two clusters in one management cluster: after the elastic lab, in its stream (the streams' lengths)
E2E_TWO := tests/e2e/test_two_clusters.py
# the pool shared with a Kubernetes workload cluster: after the Slurm 22.05 lab, in the second stream (the lengths)
E2E_CONVERGED := tests/e2e/test_converged.py
E2E_OTHERS := $(filter-out $(E2E_ELASTIC) $(E2E_AUTOSCALE) $(E2E_RELEASES) $(E2E_CONVERGED) $(E2E_TWO),$(sort $(wildcard tests/e2e/test_*.py)))
E2E_RUN := $(PYTHON) -m pytest -q --durations=8
# the matrix of make test and make e2e: the oldest ansible-core and AWX 24.6.1's EE's (2.19, the test bed's, runs the
# rest); make matrix runs 2.18 too (CI's time: with the soak, make test's streams are full)
TEST_MATRIX ?= 2.16 2.17
# $(call beside,WHO,OTHERS,AFTER): the elastic lab then the two clusters lab in the background, and the autoscale lab followed
# by the command AFTER (if any) in the background (their output in .lab/logs/e2e-elastic.log,
# e2e-autoscale.log and checks.log, printed at the end) beside the command OTHERS; fails when any fails
beside = set +e; start=$$(date +%s); \
	( $(MAKE) -s -k e2e-elastic e2e-two e2e-releases >.lab/logs/e2e-elastic.log 2>&1; rc=$$?; echo $$(( $$(date +%s) - start )) >.lab/logs/e2e-elastic.s; \
	  exit $$rc ) & elastic_pid=$$!; \
	( $(MAKE) -s e2e-autoscale >.lab/logs/e2e-autoscale.log 2>&1; echo $$? >.lab/logs/e2e-autoscale.rc; \
	  echo $$(( $$(date +%s) - start )) >.lab/logs/e2e-autoscale.s; \
	  $(or $(3),true) >.lab/logs/checks.log 2>&1; echo $$? >.lab/logs/checks.rc; \
	  echo $$(( $$(date +%s) - start )) >.lab/logs/checks.s ) & second_pid=$$!; \
	$(2) 2>&1 | tee .lab/logs/$(1)-others.log; others=$${PIPESTATUS[0]}; others_s=$$(( $$(date +%s) - start )); \
	wait $$elastic_pid; elastic=$$?; wait $$second_pid; \
	autoscale=$$(cat .lab/logs/e2e-autoscale.rc); checks=$$(cat .lab/logs/checks.rc); \
	echo "[$(1)] the elastic lab ($(E2E_ELASTIC)), then the two clusters lab ($(E2E_TWO)), the Slurm 22.05 lab ($(E2E_RELEASES)):"; cat .lab/logs/e2e-elastic.log; \
	echo "[$(1)] the autoscale lab ($(E2E_AUTOSCALE)):"; cat .lab/logs/e2e-autoscale.log; \
	$(if $(3),echo "[$(1)] after the autoscale lab$(comma) $(3):"; cat .lab/logs/checks.log;) \
	echo "[$(1)] what failed (pytest's FAILED/ERROR lines, ansible-test's and ansible-lint's errors, molecule's failed scenarios), if anything:"; \
	grep -hE '^(FAILED|ERROR) |^(ERROR|FATAL): |Failed.{0,8}: [0-9]+ failure|CRITICAL|Molecule executed .*failed|^\[matrix\] failed' .lab/logs/$(1)-others.log .lab/logs/e2e-elastic.log \
	  .lab/logs/e2e-autoscale.log .lab/logs/checks.log 2>/dev/null | cut -c1-300 || true; \
	echo "[$(1)] exit codes: $(2): $$others, the elastic lab: $$elastic, the autoscale lab: $$autoscale$(if $(3),$(comma) $(3): $$checks)"; \
	echo "[$(1)] each stream done after (s): $(2): $$others_s, the elastic lab: $$(cat .lab/logs/e2e-elastic.s), the autoscale lab: $$(cat .lab/logs/e2e-autoscale.s)$(if $(3),$(comma) then $(3): $$(cat .lab/logs/checks.s))"; \
	test $$others -eq 0 && test $$elastic -eq 0 && test $$autoscale -eq 0 && test $$checks -eq 0

e2e: dev-collection images kube-assets
	@mkdir -p .lab/logs
	@$(call beside,e2e,$(MAKE) -s -k e2e-others matrix MATRIX="$(TEST_MATRIX)",$(MAKE) -s -k e2e-converged)

e2e-elastic: dev-collection images-trixie kube-assets
	$(E2E_RUN) $(E2E_ELASTIC)

## make e2e-converged  the shared pool: a Kubernetes workload cluster and Slurm on one pool of bare metal
e2e-converged: dev-collection images-trixie kube-assets
	$(E2E_RUN) $(E2E_CONVERGED)

e2e-autoscale: dev-collection images-trixie kube-assets
	$(E2E_RUN) $(E2E_AUTOSCALE)

e2e-others: dev-collection images-trixie kube-assets
	$(E2E_RUN) $(E2E_OTHERS)

## make e2e-releases  Slurm 22.05 (Debian 12) in a lab of its own, and an upgrade refused
e2e-releases: dev-collection images kube-assets
	$(E2E_RUN) $(E2E_RELEASES)

## make e2e-two    two Slurm clusters in one management cluster, each converged on its own
e2e-two: dev-collection images-trixie kube-assets
	$(E2E_RUN) $(E2E_TWO)

## make test       everything CI runs (installs what is missing first): the real servers (make
##                 kube-assets, CPU) built while the Debian 13 lab images build (mostly downloads), then three
##                 streams at once (the Debian 12 images building beside them, for the Slurm 22.05 lab): the
##                 elastic lab (ending with a 3-minute soak: SOAK_MINUTES=0 leaves it out; docs/soak.md), the
##                 two clusters lab, the Slurm 22.05 lab (on the oldest ansible-core); the autoscale lab, then
##                 pytest, the shared pool lab, the ha molecule scenario; the cluster scenario, the other labs,
##                 the ansible-core matrix on 2.16 and 2.17 (its unit tests on the oldest: MATRIX_UNIT=all for
##                 each; make matrix runs 2.18 too), lint and sanity (the first two
##                 streams' output is printed at the end, and kept in .lab/logs/). Not in it: the default molecule
##                 scenario (the lab image boots: the cluster and ha scenarios boot it first) and the cluster
##                 scenario on 22.05 (make molecule-22.05: the 22.05 lab converges, validates and converges
##                 again with nothing changed, on the same release)
test: deps
	@mkdir -p .lab/logs
	@set +e; ( set -o pipefail; $(MAKE) -s kube-assets 2>&1 | tee .lab/logs/kube-assets.log ) & kube_pid=$$!; \
	  $(MAKE) images-trixie dev-collection; images=$$?; wait $$kube_pid; kube=$$?; \
	  echo "[test] exit codes: images: $$images, kube-assets: $$kube"; test $$images -eq 0 && test $$kube -eq 0
	@echo "[test] the Debian 12 images build beside the streams (log .lab/logs/images-bookworm.log)"
	@set +e; $(MAKE) -s images-bookworm >.lab/logs/images-bookworm.log 2>&1 & bookworm_pid=$$!; \
	  $(call beside,test,$(MAKE) -k molecule e2e-others matrix lint MATRIX="$(TEST_MATRIX)" SCENARIOS=cluster,$(MAKE) -k unit e2e-converged molecule SCENARIOS=ha); \
	  rc=$$?; wait $$bookworm_pid; exit $$rc

## make build      build the collection tarball
build:
	ansible-galaxy collection build --force

## make ee         the execution environment AWX runs the jobs in (execution-environment.yml,
##                 docs/awx.md): EE_TAG=registry/converged-hpc-ee:0.1.0; needs its base image's registry
EE_TAG ?= localhost/converged-hpc-ee:latest
ee:
	@mkdir -p .lab/ee
	rm -f .lab/ee/converged-hpc*.tar.gz
	ansible-galaxy collection build --force --output-path .lab/ee
	mv .lab/ee/converged-hpc-*.tar.gz .lab/ee/converged-hpc.tar.gz
	ansible-builder build -f execution-environment.yml -t $(EE_TAG) --container-runtime podman
