# vnetbench: the two commands a new user needs.
#   make demo   install what is missing, run the built-in `quick` scenario, print
#               its table and write demo/vnetbench.db and demo/report.html
#   make test   install what is missing and run the whole test suite
# Both must run as root (the lab is made of network namespaces).
# While changing vnetbench:
#   make check  the fast tier: the unit tests and the few lab tests marked `quick` (a few minutes)
#   make docs   the documentation site, into site/ (its reference pages regenerated from the code)

SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
# rustup's cargo, and Go where go.dev's tarball puts it (make kube)
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)

# Debian packages the lab and its workloads need: every tool's of src/vnetbench/tools.py and its
# SUPPORT_PACKAGES (tests/unit/test_tools.py keeps the two the same). Checked one by one so a
# machine that has them all never touches apt.
DEB_PACKAGES := iproute2 iputils-ping iperf3 irtt sockperf wrk apache2-utils nginx-light sysbench mbw \
                ethtool tcpdump skopeo \
                nftables procps util-linux coreutils kmod busybox-static qemu-system-x86 \
                linux-image-amd64 dropbear-bin openssh-client openssh-server zstd chromium python3-venv tmux docker.io \
                podman catatonit containerd containernetworking-plugins gcc libc6-dev openssl

.PHONY: setup deps venv bytecode emulator plotly-bundle kube demo test check test-unit test-lab docs clean-lab

setup: deps venv bytecode emulator plotly-bundle

# vnetbench's modules compiled once (compileall skips what is current): where the environment says not to write
# bytecode (PYTHONDONTWRITEBYTECODE, as on the CI machine) every `vnetbench` command, and every exec into a
# pod, would compile each of them again: 1.9 s to start a command here, 1.1 s with them compiled.
bytecode: venv
	$(PY) -m compileall -q src

# The tests run their own sshd in each of their namespaces (tests/sshlab.py). An openssh-server this target
# installs never starts the machine's own: Debian's service (systemd and init script) does not start while
# /etc/ssh/sshd_not_to_be_run exists, made here first and only when the package is not yet installed
# (remove the file to use the machine's sshd).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  case " $$missing " in *" openssh-server "*) mkdir -p /etc/ssh && touch /etc/ssh/sshd_not_to_be_run;; esac; \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

emulator:
	@if [ -f emulator/Cargo.toml ]; then \
	  command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) or Debian's cargo"; exit 1; }; \
	  cargo build --release --locked --manifest-path emulator/Cargo.toml; \
	fi

# The plotly.js the HTML report inlines: Plotly's cartesian bundle from the npm registry, pinned by version
# and checksum in src/vnetbench/report/plotly_bundle.py, installed into the venv (share/vnetbench). Downloads
# only when the file is missing or does not match; stops make with the reason when the download does not match.
plotly-bundle: venv
	$(PY) -m vnetbench.report.plotly_bundle install

# Kubernetes for the test cluster (tests/kubecluster.py): one multi-call binary (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy) built from the Go module proxy by the wrapper
# module in kube/, into KUBE_CACHE with its module and build caches (outside the repository, kept between
# runs: about 10 CPU-minutes cold, a relink after that). Needs Go 1.24 or later (Debian 12's is too old).
KUBE_VERSION := v1.34.4
KUBE_CACHE   ?= $(HOME)/.cache/vnetbench/kube
KUBE_BIN     := $(KUBE_CACHE)/kube-$(KUBE_VERSION)/kube
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
                -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
                -X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION)

# The test cluster's image registry: Debian's docker-registry program, taken out of its package (installing
# the package would start a registry on every address of the machine).
REGISTRY_BIN := $(KUBE_CACHE)/registry/docker-registry

kube: $(KUBE_BIN) $(REGISTRY_BIN)

$(REGISTRY_BIN):
	rm -rf $(dir $@)deb && mkdir -p $(dir $@)deb
	cd $(dir $@)deb && { apt-get download -q docker-registry || { apt-get update -q && apt-get download -q docker-registry; }; }
	dpkg-deb -x $(dir $@)deb/docker-registry_*.deb $(dir $@)deb/root
	mv $(dir $@)deb/root/usr/bin/docker-registry $@ && rm -rf $(dir $@)deb

$(KUBE_BIN): kube/go.mod kube/go.sum kube/cmd/kube/main.go
	@command -v go >/dev/null || { echo "go not found: the test cluster's Kubernetes is built with Go 1.24 or later (go.dev/dl)"; exit 1; }
	mkdir -p $(dir $@)
	cd kube && GOMODCACHE=$(KUBE_CACHE)/gomod GOCACHE=$(KUBE_CACHE)/gocache GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
	  CGO_ENABLED=0 go build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $@.part ./cmd/kube
	mv $@.part $@

demo: setup
	mkdir -p demo
	$(VENV)/bin/vnetbench run quick --db demo/vnetbench.db --report demo/report.html

# The lab tests one at a time (they measure), then the tests on the Kubernetes cluster (alone: a cluster
# loads the machine), then the unit tests on every core (they do not measure).
test: setup kube
	@if [ -f emulator/Cargo.toml ]; then cargo test --release --locked --manifest-path emulator/Cargo.toml; fi
	$(VENV)/bin/pytest -q --durations=25 -m "not kube" tests/integration
	VNB_KUBE_CACHE=$(KUBE_CACHE) $(VENV)/bin/pytest -q --durations=5 -m kube tests/integration
	$(VENV)/bin/pytest -q --durations=10 -n auto tests/unit
	$(VENV)/bin/vnetbench clean --check

# The edit-test loop: every unit test, then the lab tests marked `quick` (each one short run of one
# configuration: a rate qdisc's physics, a failing tool, a timeout, Ctrl-C's teardown). `make test` stays
# the suite to run before a merge.
check: setup
	$(VENV)/bin/pytest -q -n auto tests/unit
	$(VENV)/bin/pytest -q -m quick tests/integration
	$(VENV)/bin/vnetbench clean --check

test-unit: venv
	$(VENV)/bin/pytest -q tests/unit

# The docs site: the generated reference pages brought up to date, then MkDocs (pinned in the test extras)
# with warnings as errors.
docs: venv
	$(PY) -m vnetbench.docsgen
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean-lab: venv
	$(VENV)/bin/vnetbench clean
