# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# setuptools tells every editable install of a flat layout (our packages sit at the top)
	# "Editable installation ... folders with the same name ... may take precedence": expected
	# here, and the only warning left, so it is silenced by its message
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

.PHONY: install demo test test-fast lint bench fuzz browser
install: $(STAMP)

# The console's browser tests drive Debian's Chromium (tests/helpers_browser.py): installed here
# when missing and root (CI runs as root); otherwise those tests skip and say how to install it.
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	  else echo "make browser: not root, Chromium not installed: the console's browser tests will skip (sudo apt-get install chromium chromium-driver)"; fi; \
	fi

demo: $(STAMP)
	$(VENV)/bin/ens demo

# Lint, the import contracts, types, then the whole suite on two processes (pytest-xdist; the
# Spark tests share one of them and one JVM). docs/development.md has the timings.
test: lint browser
	$(PY) -m pytest -n 2 --dist loadgroup

# The edit-test loop: the in-process core, the tests marked `fast` (no Redis, Spark or other
# process: tests/conftest.py fails a fast test that starts one), each property test on a fifth
# of its examples (tests/conftest.py). docs/development.md has what it runs and its timings.
test-fast: $(STAMP)
	ENS_TEST_EXAMPLES=0.2 $(PY) -m pytest -n 2 -m "fast and not slow and not spark and not redis"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

# New random examples for the property tests (engines against each other, the index against
# direct evaluation, the parser); a failure prints the example to add to tests/cases.
fuzz: $(STAMP)
	for i in 1 2 3 4 5; do HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q -x -p no:cacheprovider \
		tests/test_differential.py tests/test_pool.py tests/test_parser.py || exit 1; done
