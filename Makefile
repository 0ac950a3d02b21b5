# ocistage — developer entry points. `make demo` and `make test` work on a fresh Debian 12.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: deps demo test lint typecheck unit bench clean

DEBIAN_PACKAGES = docker-registry skopeo umoci runc crun squashfs-tools squashfuse lua5.3 \
	lua-cjson rsync busybox-static zstd curl jq apache2-utils openssl uidmap \
	slurm-wlm slurm-client munge

DEPS_STAMP = .ci/state/deps.stamp

deps: $(DEPS_STAMP)  ## install Debian packages (needs root) and the Python package with test extras
	@# the stamp is per checkout, the editable install per interpreter: reinstall when it points
	@# at another checkout (a moved or copied tree) or is gone
	@cd / && $(PYTHON) -c 'import sys, bundler; sys.exit(bundler.__file__ != "$(CURDIR)/bundler/__init__.py")' \
		2>/dev/null || $(PYTHON) -m pip install -q -e '$(CURDIR)[test]'

$(DEPS_STAMP): pyproject.toml Makefile
	@missing=$$(for p in $(DEBIAN_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' \
			|| echo $$p; done); \
	if [ -z "$$missing" ]; then echo "Debian packages: all installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing >/dev/null; \
	else echo "not root: install these Debian packages yourself: $$missing"; fi
	$(PYTHON) -m pip install -q -e '.[test]'
	@mkdir -p $(dir $@) && touch $@

demo: deps  ## local registry + an image built on the spot -> pull -> bundle -> runc run
	bash scripts/demo.sh

lint: deps
	ruff check .

typecheck: deps
	mypy

unit:
	$(PYTHON) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

test: deps lint typecheck  ## everything CI runs
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

bench:  ## benchmarks (bench/README.md): bundle vs skopeo+umoci and the floor; stage vs rsync
	$(PYTHON) -m bench bundle
	$(PYTHON) -m bench stage

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
