# Two commands do everything on a fresh machine:
#   make course   create .venv if needed, run every notebook, write build/report.html
#   make test     create .venv if needed, run every test (unit, doctests, nbval on notebooks)
# .venv is (re)created from requirements.lock whenever it is missing or the lock changed.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The small workload for tests: every notebook runs quickly on a 2-core CPU; no progress bars.
# Every GPU claim is strict in tests (course_utils/claims.py): one that does not hold fails.
TEST_ENV := COURSE_WORKLOAD=small COURSE_PROGRESS=off COURSE_CLAIMS=strict
PYTEST := $(PY) -m pytest -p no:cacheprovider
# Tests run on every core (pytest-xdist), a file (a notebook) per worker at a time: most
# of the suite waits on one core for kernels, processes and imports. TEST_JOBS=0: one.
TEST_JOBS ?= auto

.PHONY: help env course site test quick lint lab lab-answers gpu-rehearsal gpu-lane bench bench-ci lock clean student colab-check

help:
	@echo "make course    run every notebook headlessly, write build/report.html"
	@echo "make site      the course website from make course's notebooks, in build/site/"
	@echo "make test      unit tests, doctests and nbval on every notebook (small workload)"
	@echo "make quick     the inner loop: unit tests and doctests not marked slow, no notebooks"
	@echo "make colab-check  Colab's versions + colab_setup.sh + every notebook (pip only)"
	@echo "make lab       JupyterLab on the exercises without their answers, in my-notebooks/"
	@echo "make lab-answers  JupyterLab on notebooks/, answers included (to check your work)"
	@echo "make gpu-lane  the GPU record: GPU tests and full-size notebooks (on a GPU machine)"
	@echo "make bench     run benchmarks/, figures as JSON in build/bench/"
	@echo "make bench-ci  time .ci/run and make course on a fresh clone (build/bench/ci.json)"
	@echo "make lock      regenerate requirements.lock and environment.yml"
	@echo "make student   student versions of the notebooks (answers removed) in build/student/"

# (Re)create the environment when the lock file's content differs from the one installed.
env:
	@if ! cmp -s requirements.lock $(VENV)/requirements.lock; then \
	  $(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "need Python >= 3.11 for the lock (found " + sys.version.split()[0] + "); set PYTHON=python3.11"' || exit 1; \
	  echo "Creating $(VENV) from requirements.lock (a few minutes the first time)..."; \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && \
	  $(PY) -m pip install --quiet --disable-pip-version-check --progress-bar off -r requirements.lock && \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . && \
	  cp requirements.lock $(VENV)/requirements.lock && \
	  echo "$(VENV) is ready." || { echo "error: could not create $(VENV) (see above)"; rm -rf $(VENV); exit 1; }; \
	fi

course: env
	$(PY) -m course_utils run-notebooks notebooks --out build

# The website: README, the executed notebooks (build/notebooks, from `make course`), every
# page of docs/ and build/report.html, rendered by mkdocs into build/site/ (nothing runs).
site: env
	@test -d build/notebooks || { echo "error: no build/notebooks: run make course first"; exit 1; }
	$(PY) -m course_utils site build/notebooks --out build/site --report build/report.html

lint: env
	$(PY) -m ruff check course_utils tests benchmarks .ci
	$(PY) -m ruff format --check course_utils
	$(PY) -m mypy course_utils

# The GPU record's rehearsal (tests/test_gpu_rehearsal.py, marked rehearsal) is left out:
# `make gpu-rehearsal` runs it alone (its 540 s slot wants a quiet machine); .ci/run runs it
# after `make test`, with Colab's rehearsal (COLAB_REHEARSE=1 make colab-check).
test: env lint
	$(TEST_ENV) $(PYTEST) -q -rs --durations=25 -n $(TEST_JOBS) --dist loadfile -m "not rehearsal" \
	  --nbval-lax --doctest-modules --ignore=course_utils/__main__.py course_utils tests notebooks

# The inner loop while changing the package: no notebooks, no test marked slow (one that
# takes seconds: a kernel, a subprocess, a training run), no lint; on every core too.
quick: env
	$(TEST_ENV) $(PYTEST) -q -m "not slow" -n $(TEST_JOBS) --dist loadfile --doctest-modules \
	  --ignore=course_utils/__main__.py course_utils tests

# Colab's torch, torchvision and ipywidgets (.ci/colab-versions.txt) in .venv-colab, then
# colab_setup.sh against this working tree, then nbval on every notebook (small workload).
colab-check:
	bash .ci/colab_check.sh

# JupyterLab refuses to run as root unless told (containers often run as root).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

student: env
	$(PY) -m course_utils student notebooks --out build/student

# JupyterLab as learners get it, on the student versions (no answers, no hidden checks) in
# $(LAB_DIR): written from notebooks/ for each notebook not there yet, so a learner's work
# there is never overwritten (delete a file to start it afresh). `make lab-answers` opens
# notebooks/ itself, answers and hidden checks included, to check your work against.
# jupyter-config/ (first in JUPYTER_CONFIG_PATH) turns off nbgrader's lab extension (its
# menu, "Validate" button and "Create Assignment" panel), which the lock installs for
# instructors (`.venv/bin/jupyter lab` shows it); its lab-settings/ turns off the Jupyter
# news toast (JupyterLab would ask on first start whether to fetch news from the internet).
LAB_DIR ?= my-notebooks
LAB := JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter-config$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
  $(VENV)/bin/jupyter lab $(LAB_ARGS) --LabApp.app_settings_dir="$(CURDIR)/jupyter-config/lab-settings"
lab: env
	$(PY) -m course_utils student notebooks --out $(LAB_DIR) --keep
	$(LAB) $(LAB_DIR)/

gpu-rehearsal: env
	$(TEST_ENV) $(PYTEST) -q -rs -m rehearsal tests/test_gpu_rehearsal.py

lab-answers: env
	$(LAB) notebooks/

# The GPU record (docs/gpu-record.md): the doctor's check, the gpu/multigpu tests and
# every notebook at the full workload, strict GPU claims, record in build/gpu-lane/. Runs on
# the torch that is here: .venv if there is one, else python3 (Colab's, Kaggle's, a cluster
# module's); no lock rebuild, nothing installed. Fails at once, in one line, unless this
# torch can use a GPU (a driver older than 580 with the locked CUDA 13 torch: see docs/running-locally.md, "The GPU lane").
# More options: make gpu-lane GPU_RECORD_ARGS="--budget-s 540 --notebook-timeout-s 240"
gpu-lane: PY := $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
gpu-lane:
	$(PY) -m course_utils doctor --require-gpu
	$(PY) -m course_utils gpu-record --out build/gpu-lane $(GPU_RECORD_ARGS)

# bench_ci.py is left out: it times .ci/run on a fresh clone (over 20 minutes on a 2-core
# machine on 2026-12-07; wants an idle one): `make bench-ci`.
bench: env
	@mkdir -p build/bench
	@for script in benchmarks/bench_*.py; do \
	  [ "$$script" = benchmarks/bench_ci.py ] && continue; \
	  echo "== $$script"; $(PY) $$script --out build/bench || exit 1; \
	done

bench-ci: env
	$(PY) benchmarks/bench_ci.py --out build/bench

lock: env
	$(PY) -m pip install --quiet uv
	$(PY) .ci/lock.py

clean:
	rm -rf build
