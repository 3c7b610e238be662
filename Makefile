# Every target installs what it needs on a fresh Debian 12 (run as root).
#   make demo   - README command 1: a demo chain with real traffic in throwaway namespaces
#   make test   - README command 2: lint + type check + unit and netns tests (what CI runs)

SHELL := /bin/bash
PYTHON_BASE ?= /usr/bin/python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make demo` installs only what tests/demo.py uses: ip and tc, nft and libnftables (portmap's
# default backend), the Go bridge and host-local the demo chain starts with, curl, and venv.
# `make test` adds the iptables backend's tools, conntrack, the real runtimes (podman, runc,
# containerd), Go and Debian's libcni sources (the tests' libcni client is built from them)
# and busybox (the runtimes' container images). README lists both, word for word.
DEMO_APT := iproute2 nftables libnftables1 containernetworking-plugins curl python3-venv
TEST_APT := $(DEMO_APT) iptables conntrack gcc python3-dev ca-certificates \
	podman runc containerd golang-go golang-github-appc-cni-dev busybox-static
APT_PACKAGES := $(TEST_APT)
CNI_BIN_DIR ?= /opt/cni/bin
CNI_META_PREFIX ?= /opt/cni-meta-plugins
INSTALL_APT := python3-venv python3-dev gcc libnftables1 iptables
# `make bench` adds podman's own network backend, which bench/podman_netavark.py runs beside
# ours (every podman of the tests and benches names its backend in its own containers.conf:
# with none named, podman 4 picks netavark for a fresh store once it is installed).
BENCH_APT := netavark aardvark-dns

.PHONY: all deps apt apt-demo venv lint test test-unit test-runtimes fuzz demo bench install uninstall dist clean

all: test

# Docker's containerd.io package ships containerd and runc and conflicts with Debian's:
# where it is installed it stands for both (apt would otherwise remove it).
installed = dpkg-query -W -f='$${Status}' $(1) 2>/dev/null | grep -q "ok installed"
apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  $(call installed,$$p) && continue; \
	  case $$p in containerd|runc) $(call installed,containerd.io) && continue;; esac; \
	  missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

apt-demo:
	@$(MAKE) --no-print-directory apt APT_PACKAGES="$(DEMO_APT)"

$(VENV)/.installed: pyproject.toml | apt-demo
	test -x $(PY) || $(PYTHON_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $@

venv: $(VENV)/.installed

deps: apt venv

# The size of common/ and the three meta-plugins (flatnet/ and flatnet_ipam/ are counted
# apart): a reader new to the project reads them in an afternoon. Above the limit, remove
# weight (shims, dead code, contortions) rather than cram lines; raising it is a decision
# said in the commit that does.
SIZE_LIMIT := 9570
SIZED := common portmap bandwidth tuning

# Besides style and types: the import contracts and the dependency lists of pyproject.toml,
# and no dead code (.vulture_allowlist.py says why each name it keeps is used). The second
# deptry run lets tests/ and bench/ use the test and bench extras and fails only on imports
# that nothing declares, or that only another package's dependencies bring along. No
# tracked symlinks: the project has none, and one (a borrowed .venv) broke a fresh clone.
lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/deptry .
	$(VENV)/bin/deptry tests bench --exclude '\.venv' --ignore DEP002,DEP004
	$(VENV)/bin/vulture
	$(VENV)/bin/kubernetes-validate --strict --quiet $$(find deploy/kubernetes -name '*.yaml' -o -name '*.yml')
	@links=$$(git ls-files -s 2>/dev/null | awk '$$1 == "120000" {print $$4}'); \
	if [ -n "$$links" ]; then echo "tracked symlinks (a venv taken in by mistake?): $$links"; exit 1; fi
	@lines=$$(cat $(addsuffix /*.py,$(SIZED)) | wc -l); \
	if [ "$$lines" -gt $(SIZE_LIMIT) ]; then \
	  echo "$(SIZED): $$lines lines, more than SIZE_LIMIT $(SIZE_LIMIT)"; exit 1; fi

# pytest exits 5 when it collected nothing: that is a failure here, like any non-zero code.
test: lint
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

test-unit: deps
	$(PY) -m pytest -m "not root" $(PYTEST_ARGS)

demo: apt-demo venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) tests/demo.py

# Regenerates bench/results/ (about 20 minutes on a 2-core VM; portmap_scale builds up 5000
# attachments). `make bench BENCH_ARGS=--quick` is a smoke test of every bench (a few rounds,
# written to bench/results/raw/quick/, which is not committed); BENCHES="..." picks some.
BENCHES := startup installed_startup plugin_calls meta_chain flatnet_chain podman_run \
	podman_netavark runtime_pods tuning_latency bandwidth_latency bandwidth_accuracy \
	portmap_scale ipam_scale
BENCH_ARGS ?=
bench: deps
	@$(MAKE) --no-print-directory apt APT_PACKAGES="$(BENCH_APT)"
	$(PY) -m pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	for b in $(BENCHES); do \
	  echo "== bench/$$b.py $(BENCH_ARGS)"; \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/$$b.py $(BENCH_ARGS) || exit 1; \
	done

# `make image`: the DaemonSet's image (deploy/Containerfile), built offline by
# deploy/build-image.sh: FROM scratch, the bundle (pyroute2 copied from the venv), a static
# busybox and deploy/install.sh. Prints the tag (IMAGE=... sets it) and the digest.
IMAGE ?=
.PHONY: image
image: deps
	deploy/build-image.sh --deps-from "$$(echo $(VENV)/lib/python3*/site-packages)" \
	  $(if $(IMAGE),--tag $(IMAGE))

# README: `make install` (or `sudo deploy/install.sh`) puts portmap, bandwidth and tuning
# into $(CNI_BIN_DIR), running from their own venv under $(CNI_META_PREFIX).
install:
	@$(MAKE) --no-print-directory apt APT_PACKAGES="$(INSTALL_APT)"
	deploy/install.sh --python $(PYTHON_BASE) --bin-dir $(CNI_BIN_DIR) --prefix $(CNI_META_PREFIX)

# Without CNI_BIN_DIR given, install.sh takes the bin dir from its install record: after
# `make install CNI_BIN_DIR=/usr/libexec/cni`, a plain `make uninstall` removes those.
uninstall:
	deploy/install.sh --uninstall --prefix $(CNI_META_PREFIX) \
	  $(if $(filter file default,$(origin CNI_BIN_DIR)),,--bin-dir $(CNI_BIN_DIR))

# `make dist`: a wheel and an sdist in dist/ (PEP 517, through `build`). The wheel is built
# from the sdist, which proves the sdist holds what a build needs. --no-isolation: the
# venv's setuptools builds it, so no download (offline once `make deps` has run).
dist: venv
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	@ls -l dist

# The runtime suites (podman, libcni client, containerd, install) also run in `make test`.
test-runtimes: deps
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest tests/runtimes $(PYTEST_ARGS)

# 10,000 fuzzed calls per plugin against a real kernel (`make test` runs 500 each); about
# 20 minutes per plugin on a 2-core VM. Figures: one JSON line per plugin in FUZZ_STATS.
FUZZ_STATS ?= build/fuzz-stats.jsonl
fuzz: deps
	mkdir -p "$(dir $(FUZZ_STATS))"
	HYPOTHESIS_PROFILE=fuzz CNI_META_FUZZ_STATS="$(abspath $(FUZZ_STATS))" \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest tests/kernel/test_fuzz.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
