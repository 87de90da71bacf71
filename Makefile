# converged.hpc: make lab brings up the lab and runs the main job; make test runs the gate, make test-all everything.
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

.PHONY: help deps dev-collection kube-assets lab lab-scale lab-move lab-rebalance lab-down lab-ping lab-status images images-trixie images-bookworm images-forky unit kube-keda lint sanity matrix molecule molecule-22.05 e2e e2e-releases e2e-two e2e-elastic e2e-autoscale e2e-others e2e-storage e2e-shape e2e-converged e2e-cores e2e-forky e2e-rollout e2e-upgrade e2e-keda test test-all build ee

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

## make images-forky  the Debian forky (testing) images: Slurm 26.05, no SSSD (LAB_SUITE=forky, LAB_DIRECTORY=0)
images-forky:
	$(call images_of,forky)

## make kube-assets  build kube-apiserver, the Cluster API, CAPM3 and Bare Metal Operator managers from
##                 their Go modules (cached by version: minutes cold, seconds after), link them and etcd
##                 in .lab/kube-assets (KUBEBUILDER_ASSETS); KEDA=1 adds KEDA's operator and metrics server
##                 and kube-controller-manager (docs/autoscale.md, KEDA)
KEDA ?= 0
kube-assets:
	@if [ "$$KUBEBUILDER_ASSETS" = "$(KUBE_ASSETS)" ]; then KUBE_ASSETS_KEDA=$(KEDA) kube-assets/build.sh "$(KUBE_ASSETS)"; \
	else echo "[kube-assets] KUBEBUILDER_ASSETS=$$KUBEBUILDER_ASSETS (given: nothing built)"; fi

## make unit       unit, integration and real-apiserver tests (pytest; tests/kube: kube-apiserver, and the
##                 controllers' smoke test, on the servers make kube-assets builds)
unit: dev-collection kube-assets
	$(PYTHON) -m pytest -q --durations=10 tests/unit tests/integration tests/kube

## make matrix     on each ansible-core the collection claims besides the test bed's 2.19 (2.16, 2.17, 2.18, 2.20,
##                 2.21; MATRIX="2.16" for one; 2.20 and 2.21 on a Python 3.12+ control node),
##                 in venvs of their own: the unit tests, sanity's release-dependent tests, a syntax check of
##                 every playbook (tests/matrix.sh); the releases lab converges on the oldest
matrix: dev-collection kube-assets
	tests/matrix.sh $(MATRIX)

## make lint       ansible-lint (production profile) and ansible-test sanity
## make kube-keda  KEDA v2.21 (its operator, its metrics server behind the aggregation layer) and the HPA
##                 controller scaling a MachineDeployment of the real Cluster API by a partition's demand read
##                 from slurmrestd's jobs (tests/kube/test_keda.py; builds make kube-assets KEDA=1 first)
kube-keda: dev-collection
	@$(MAKE) -s --no-print-directory kube-assets KEDA=1
	CONVERGED_KEDA_REQUIRED=1 $(PYTHON) -m pytest -q --durations=5 tests/kube/test_keda.py

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

## make e2e        every end-to-end lab whole (make test-all's labs, in its two streams); E2E_MARK=gate in
##                 any e2e-* target runs only that lab's gate tests (what make test runs of it)
E2E_MARK ?=
E2E_RUN = $(PYTHON) -m pytest -q --durations=8 $(if $(E2E_MARK),-m $(E2E_MARK))
e2e: dev-collection images kube-assets
	@mkdir -p .lab/logs
	$(PYTHON) tests/tiers.py all --only elastic,two,images-bookworm,releases,cores-lab,forky,upgrade,autoscale,converged,shape,storage,rollout

e2e-elastic: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_elastic.py

## make e2e-converged  the shared pool: a Kubernetes workload cluster and Slurm on one pool of bare metal
e2e-converged: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_converged.py

e2e-autoscale: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_autoscale.py

e2e-storage: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_storage_identity.py

e2e-shape: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_shape.py

e2e-others: e2e-shape e2e-storage

## make e2e-forky  Debian forky (testing) machines in a lab of their own: Slurm 26.05 on Python 3.14 hosts, by
##                 ansible-core 2.21; the main job, a second converge changing nothing
e2e-forky: dev-collection images-forky kube-assets
	$(E2E_RUN) tests/e2e/test_forky.py

## make e2e-keda  KEDA as the autoscaler in a lab (LAB_KEDA=1): keda.yml's token and ScaledObject, held jobs
##                 scaling nothing, three jobs 0 -> 3 -> 0 by KEDA with the reconcile rulebook, every job COMPLETED
e2e-keda: dev-collection images-trixie
	@$(MAKE) -s --no-print-directory kube-assets KEDA=1
	$(E2E_RUN) tests/e2e/test_keda.py

## make e2e-rollout  a new node image rolled over a busy 4-node cluster (playbooks/rollout.yml): every job run to
##                 its end, a broken image stopped after one Machine and rolled back, a deadline kept
e2e-rollout: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_rollout.py

## make e2e-upgrade  Slurm 24.11 -> 26.05 on an HA cluster with jobs running: slurmdbd reinstalled with Debian forky
##                   (a checked dump, the database converted), then the controllers (upgrade_controllers.yml: one
##                   handover's outage), nothing lost in accounting
e2e-upgrade: dev-collection images-trixie images-forky kube-assets
	$(E2E_RUN) tests/e2e/test_upgrade.py

## make e2e-releases  Slurm 22.05 (Debian 12) in a lab of its own, and an upgrade refused
e2e-releases: dev-collection images kube-assets
	$(E2E_RUN) tests/e2e/test_releases.py

## make e2e-cores  the main job on the newest and the oldest ansible-core (2.21 on Python 3.12+, 2.16)
e2e-cores: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_cores.py

## make e2e-two    two Slurm clusters in one management cluster, each converged on its own
e2e-two: dev-collection images-trixie kube-assets
	$(E2E_RUN) tests/e2e/test_two_clusters.py

# what both tiers do first: the real servers (make kube-assets, CPU) built while the Debian 13 lab images build
# (mostly downloads)
prepare = set +e; mkdir -p .lab/logs; ( set -o pipefail; $(MAKE) -s kube-assets 2>&1 | tee .lab/logs/kube-assets.log ) & \
	kube_pid=$$!; $(MAKE) -s images-trixie dev-collection; images=$$?; wait $$kube_pid; kube=$$?; \
	echo "[$(1)] ready after $$(( $$(date +%s) - $$start )) s: images exit $$images, kube-assets exit $$kube"; \
	test $$images -eq 0 && test $$kube -eq 0

## make test       the gate, what CI runs (docs/testing.md): every unit, integration and real-apiserver test,
##                 the oldest ansible-core's tests, lint and sanity, and each lab's gate tests (one path
##                 through each promise), in two streams; a summary per suite at the end (.lab/logs/summary-gate.txt)
test: deps
	@start=$$(date +%s); $(call prepare,gate)
	@$(PYTHON) tests/tiers.py gate

## make test-all   everything: make test's suites whole, every lab whole (the elastic lab's soak), every molecule
##                 scenario (22.05 too), the ansible-core matrix; its summary (.lab/logs/summary-all.txt) is
##                 what a change's note quotes (docs/testing.md)
test-all: deps
	@start=$$(date +%s); $(call prepare,all)
	@$(PYTHON) tests/tiers.py all

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
