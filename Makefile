# ocistage — developer entry points. `make demo` and `make test` work on a fresh Debian 12, as
# root or as a user with sudo: the Python side lives in a virtual environment, $(VENV), made
# with $(PYTHON) (Debian's python3 is "externally managed", PEP 668: no pip into it).
PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: deps venv demo test lint typecheck unit example bench clean dist man docs \
	site-install site-uninstall site-wheelhouse

DEBIAN_PACKAGES = python3-venv \
	docker-registry skopeo umoci runc crun squashfs-tools squashfuse lua5.3 \
	lua-cjson rsync busybox-static zstd curl jq apache2-utils openssl uidmap \
	slurm-wlm slurm-client munge gnupg

DEPS_STAMP = .ci/state/deps.stamp
VENV_BIN = $(abspath $(VENV))/bin
VENV_STAMP = $(VENV)/ocistage-installed.stamp
# runc and other tools live in /usr/sbin, which a Debian user's PATH lacks
RUN_PATH = $(VENV_BIN):$(PATH):/usr/local/sbin:/usr/sbin:/sbin
# root runs apt-get itself; anyone else through sudo (which asks for a password when it must)
SUDO = $(if $(filter 0,$(shell id -u)),,sudo)

deps: $(DEPS_STAMP) venv  ## Debian packages (as root or with sudo), then the venv with the package

# The editable install in $(VENV) with its test extras. The stamp is per venv; the install is
# redone when it points at another checkout (a moved or copied tree) or is gone.
venv: $(VENV_STAMP)
	@cd / && $(VENV_BIN)/python -c 'import sys, ocistage; sys.exit(ocistage.__file__ != "$(CURDIR)/ocistage/__init__.py")' \
		2>/dev/null || $(VENV_BIN)/python -m pip install -q -e '$(CURDIR)[test]'

$(VENV_STAMP): pyproject.toml
	@$(VENV_BIN)/python -c '' 2>/dev/null || $(PYTHON) -m venv --clear $(VENV) || { \
		echo "make: '$(PYTHON) -m venv' failed; on Debian it needs python3-venv: $(SUDO) apt-get install python3-venv" >&2; \
		exit 1; }
	$(VENV_BIN)/python -m pip install -q -e '.[test]'
	@touch $@
	@echo "ocistage is installed in $(VENV): '. $(VENV)/bin/activate' puts it on PATH (README.md)"

$(DEPS_STAMP): Makefile
	@missing=$$(for p in $(DEBIAN_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' \
			|| echo $$p; done); \
	if [ -z "$$missing" ]; then echo "Debian packages: all installed"; \
	elif [ -n "$(SUDO)" ] && ! command -v $(SUDO) >/dev/null; then \
		echo "make: not root and no sudo: install these Debian packages as root:" $$missing >&2; exit 1; \
	else \
		echo "installing" $$missing; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing >/dev/null; \
	fi
	@mkdir -p $(dir $@) && touch $@

demo: deps  ## local registry + an image built on the spot -> pull -> bundle -> runc run
	PATH="$(RUN_PATH)" bash scripts/demo.sh

lint: deps
	$(VENV_BIN)/ruff check .

typecheck: deps
	$(VENV_BIN)/mypy

unit: deps
	PATH="$(RUN_PATH)" $(VENV_BIN)/python -m pytest -q -m "not e2e" $(PYTEST_ARGS)

test: deps lint typecheck  ## everything CI runs
	PATH="$(RUN_PATH)" $(VENV_BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory example

# docs/testing.md's example project, as a user runs it: a copy outside this repository (no
# conftest, no pyproject of ours), against the installed package and its pytest plugin
example: deps
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
		cp -r examples/my-image-project "$$dir/" && cd "$$dir/my-image-project" && \
		PATH="$(RUN_PATH)" $(VENV_BIN)/python -m pytest -q -p no:cacheprovider

# benchmarks only: podman as a peer, matplotlib for the scale plot (tests need neither)
BENCH_PACKAGES = podman
BENCH_STAMP = .ci/state/bench-deps.stamp
SCALE_SET ?= quick

$(BENCH_STAMP): Makefile
	@missing=$$(for p in $(BENCH_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' \
			|| echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing" $$missing; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing >/dev/null; fi
	$(VENV_BIN)/python -m pip install -q -e '.[test,bench]'
	@mkdir -p $(dir $@) && touch $@

bench:  deps $(BENCH_STAMP) ## benchmarks (bench/README.md): bundle vs peers and the floor; stage vs rsync; scale
	PATH="$(RUN_PATH)" $(VENV_BIN)/python -m bench bundle
	PATH="$(RUN_PATH)" $(VENV_BIN)/python -m bench stage
	PATH="$(RUN_PATH)" $(VENV_BIN)/python -m bench scale --set $(SCALE_SET)

# docs/architecture.md's generated tables (modules, errors) from the code; tests/test_architecture_doc.py
# fails until this is run after a module is added, moved or deleted or its docstring changes
docs:
	$(VENV_BIN)/python scripts/architecture_tables.py

# ocistage(1) from the commands' own --help texts (ocistage.bundler.cli.manpage), where man-db
# looks for the ocistage on PATH that README.md puts in ~/.local/bin: `man ocistage`
MAN_DIR ?= $(HOME)/.local/share/man/man1
MAN_PYTHON ?= $(VENV_BIN)/python
man:
	$(MAN_PYTHON) -m ocistage.bundler.cli.manpage -o "$(MAN_DIR)/ocistage.1"
	$(MAN_PYTHON) -m ocistage.bundler.pyxis.manpage -o "$(MAN_DIR)/ocistage-pyxis-importer.1"
	@echo "wrote $(MAN_DIR)/ocistage.1 and ocistage-pyxis-importer.1: man ocistage, man ocistage-pyxis-importer"

# the wheel and sdist a site installs (`pip install dist/ocistage-*.whl`), built offline with the
# venv's setuptools; tests/plugin/test_coexistence.py installs such a wheel into a fresh venv.
# Needs only a venv with setuptools and wheel (made by `make venv` when there is none): it
# installs nothing on the machine (no `deps`) and never reinstalls the venv, and setuptools'
# build/ is removed before and after, so a module deleted from the source never ships from an
# old build/lib (tests/plugin/test_dist.py)
dist:
	@$(VENV_BIN)/python -c 'import setuptools.build_meta, wheel' 2>/dev/null \
		|| $(MAKE) --no-print-directory venv
	rm -rf dist build
	$(VENV_BIN)/python -m pip wheel -q --no-deps --no-build-isolation --no-index -w dist .
	$(VENV_BIN)/python -c 'import setuptools.build_meta as b; b.build_sdist("dist")' >/dev/null
	rm -rf build
	@ls dist

# A site install for every user under PREFIX (docs/site.md, scripts/site-install.sh): a venv of
# Debian's /usr/bin/python3, bin/ links, man pages, bash completion, modulefiles; nothing outside
# PREFIX. With WHEELHOUSE (made by `make site-wheelhouse` on a machine with the internet) it
# installs offline from there; without, it builds the wheel here (`make dist`) and takes the
# dependencies from the package index. PREFIX and WHEELHOUSE reach the script through the
# environment (make exports variables given on its command line), never through the shell's
# parser.
site-install:
	@test -n "$$PREFIX" || { echo "make: site-install needs PREFIX=DIR (e.g. /opt/ocistage)" >&2; exit 2; }
	@if [ -n "$$WHEELHOUSE" ]; then \
		bash scripts/site-install.sh --wheelhouse "$$WHEELHOUSE" -- "$$PREFIX"; \
	else \
		$(MAKE) --no-print-directory dist >/dev/null && \
		bash scripts/site-install.sh --wheel "$$(ls dist/ocistage-*-py3-none-any.whl)" -- "$$PREFIX"; \
	fi

site-uninstall:
	@test -n "$$PREFIX" || { echo "make: site-uninstall needs PREFIX=DIR" >&2; exit 2; }
	bash scripts/site-install.sh --uninstall -- "$$PREFIX"

# On a machine with the internet and the same Python (3.11 on Debian 12) and architecture: the
# ocistage wheel and every wheel it needs, into WHEELHOUSE, for `make site-install WHEELHOUSE=`
# on one without (docs/site.md says how to fetch them for another platform)
site-wheelhouse:
	@test -n "$$WHEELHOUSE" || { echo "make: site-wheelhouse needs WHEELHOUSE=DIR" >&2; exit 2; }
	$(MAKE) --no-print-directory dist >/dev/null
	mkdir -p -- "$$WHEELHOUSE"
	cp dist/ocistage-*-py3-none-any.whl "$$WHEELHOUSE/"
	$(VENV_BIN)/python -m pip download -q --no-cache-dir --only-binary=:all: -d "$$WHEELHOUSE" \
		"$$WHEELHOUSE/$$(cd dist && ls ocistage-*-py3-none-any.whl)"
	@echo "wrote $$WHEELHOUSE: copy it to the site, then make site-install PREFIX=... WHEELHOUSE=..."


clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
