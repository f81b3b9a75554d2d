# Two commands on a fresh machine:
#   make report   - installs into .venv, runs every notebook at the default scale -> runs/default/
#   make test     - installs into .venv (with test extras), runs the test suite
# TORCH_SPEC is installed before anything that depends on torch. On this CPU machine
# torch==2.13.0 is a CPU build on disk; on a CUDA machine use e.g. TORCH_SPEC="torch>=2.2"
# with your CUDA index, or install torch into .venv yourself first.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PARAMS ?= params/default.yaml
OUT ?= runs/default
PY := $(VENV)/bin/python

.PHONY: venv report test notebooks clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

venv: $(VENV)/.installed

report: venv
	$(PY) -m workbook_lib run --params $(PARAMS) --out $(OUT)

test: venv
	$(PY) -m pytest -q

# regenerate notebooks/*.ipynb from notebooks/src/*.py (percent format, no outputs)
notebooks: venv
	$(PY) tools/build_notebooks.py

clean:
	rm -rf runs data_snapshots/cache
