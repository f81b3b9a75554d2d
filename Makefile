# Two commands on a fresh machine:
#   make report   - installs into .venv, runs every notebook at the default scale -> runs/default/
#   make test     - installs into .venv (with test extras), runs the test suite
# and the documentation: make docs - builds docs/ into site/index.html (mkdocs, strict)
# TORCH_SPEC is installed before anything that depends on torch (default: the CPU build
# torch==2.13.0). With a CUDA machine, pass your build, e.g. TORCH_SPEC="torch>=2.2" with
# PIP_EXTRA_INDEX_URL pointing at the CUDA wheels you use, or install torch into .venv first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PARAMS ?= params/default.yaml
OUT ?= runs/default
PY := $(VENV)/bin/python

.PHONY: venv report test docs notebooks kernel clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,lightning]"
	$(PY) -m workbook_lib kernel >/dev/null
	$(PY) -m workbook_lib notebooks >/dev/null
	touch $@

venv: $(VENV)/.installed

report: venv
	$(PY) -m workbook_lib run --params $(PARAMS) --out $(OUT)

# the suite in one pytest-xdist worker per allowed CPU (at most 4), each file in one worker,
# the longest files first (tests/conftest.py), the 15 longest tests listed at the end;
# `.venv/bin/python -m pytest` runs it in one process
test: venv
	$(PY) -m pytest -q -rs -n auto --dist loadfile --no-loadscope-reorder --durations=15

# the documentation site from docs/ and mkdocs.yml into site/ (open site/index.html); strict: a
# broken link or anchor, or a page missing from the nav, fails it
docs: venv
	$(PY) -m mkdocs build --strict --site-dir site

# notebooks/*.ipynb from their jupytext sources (the parameters cell from the params schema)
notebooks: venv
	$(PY) -m workbook_lib notebooks

# the Jupyter kernel gnn-workbook of this clone, registered inside .venv (not per user, so two
# clones each run their own code); make venv registers it, make clean removes it
kernel: venv
	$(PY) -m workbook_lib kernel

clean:
	rm -rf runs data_snapshots/cache notebooks/*.ipynb site
	if [ -x $(PY) ]; then $(PY) -m workbook_lib kernel --remove; fi
