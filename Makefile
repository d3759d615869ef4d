# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

.PHONY: install demo test lint bench fuzz
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ens demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

# New random examples for the property tests (engines against each other, the index against
# direct evaluation, the parser); a failure prints the example to add to tests/cases.
fuzz: $(STAMP)
	for i in 1 2 3 4 5; do HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q -x -p no:cacheprovider \
		tests/test_differential.py tests/test_pool.py tests/test_parser.py || exit 1; done
