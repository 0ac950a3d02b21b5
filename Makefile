# ocistage — developer entry points. `make demo` and `make test` work on a fresh Debian 12.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: deps demo test lint typecheck unit bench clean

DEBIAN_PACKAGES = docker-registry skopeo umoci runc crun squashfs-tools squashfuse lua5.3 \
	lua-cjson rsync busybox-static zstd curl jq apache2-utils openssl uidmap \
	slurm-wlm slurm-client munge

deps:  ## install Debian packages (needs root) and the Python package with test extras
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $(DEBIAN_PACKAGES) >/dev/null; \
	else echo "not root: install these Debian packages yourself: $(DEBIAN_PACKAGES)"; fi
	$(PYTHON) -m pip install -q -e '.[test]'

demo: deps  ## local registry + an image built on the spot -> pull -> bundle -> runc run
	bash scripts/demo.sh

lint:
	ruff check .

typecheck:
	mypy

unit:
	$(PYTHON) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

test: lint typecheck  ## everything CI runs
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

bench:  ## benchmarks (bench/README.md): bundle vs skopeo+umoci and the floor; stage vs rsync
	$(PYTHON) -m bench bundle
	$(PYTHON) -m bench stage

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
