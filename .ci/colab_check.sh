#!/usr/bin/env bash
# make colab-check: the course as a new user gets it on Google Colab, and with pip alone.
#
#   1. an environment with Colab's own versions (.ci/colab-versions.txt) and nothing else,
#      in .venv-colab (rebuilt only when that file changes);
#   2. colab_setup.sh, as the notebooks' first cell runs it on Colab, installing this
#      working tree (COURSE_SOURCE) with pip: whatever the package does not declare is
#      missing here too;
#   3. every notebook under nbval with the small workload, importing the installed
#      package (not the checkout);
#   4. with COLAB_REHEARSE=1: the GPU record rehearsed as on Colab (gpu-record --rehearse,
#      COLAB_RELEASE_TAG set); not yet run in Colab's own versions, so not part of CI yet.
#
# Settings: COLAB_PYTHON (the interpreter; default: Colab's Python version, from the
# "# python:" line of .ci/colab-versions.txt, when this machine has it (PATH or pyenv),
# else python3.11 with a note), COLAB_VENV (default .venv-colab), NOTEBOOKS (default
# notebooks/*.ipynb). The notebooks run in Colab's IPython and ipykernel (pinned there).
#
# `bash .ci/colab_check.sh --prepare` does step 1 only (the download: .ci/run starts it in
# the background while `make test` runs, so the two overlap).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PINS=.ci/colab-versions.txt
VENV="${COLAB_VENV:-.venv-colab}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac  # colab_setup.sh runs elsewhere
ME="colab-check"
say() { printf '%s: %s\n' "$ME" "$*"; }
die() {
    printf '%s: error: %s\n' "$ME" "$*" >&2
    exit 1
}
started=$SECONDS

# --- the interpreter: Colab's Python version when this machine has it ---------------------
want="$(sed -n 's/^# python: *//p' "$PINS")"
runs() { [ -n "$1" ] && "$1" -c 'import ssl, venv' >/dev/null 2>&1; }
python="${COLAB_PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in "python$want" "$(pyenv root 2>/dev/null)/versions/$want"*/bin/python3 python3.11 python3; do
        if runs "$candidate"; then python="$candidate" && break; fi
    done
fi
runs "$python" || die "no usable Python (set COLAB_PYTHON)"
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
note=""
[ "$version" = "$want" ] || note=" (Colab has $want; not found here)"
say "Python $version$note: $python"

# --- 1. Colab's versions, nothing more ------------------------------------------------------
if ! cmp -s "$PINS" "$VENV/colab-versions.txt" || [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $(grep -v '^#' "$PINS" | tr '\n' ' ')(about 5 GB the first time)"
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off -r "$PINS" \
        || { rm -rf "$VENV"; die "could not install Colab's versions"; }
    cp "$PINS" "$VENV/colab-versions.txt"
    say "environment ready after $((SECONDS - started)) s"
else
    say "reusing $VENV (same $PINS)"
fi
if [ "${1:-}" = "--prepare" ]; then
    exit 0
fi

# --- 2. colab_setup.sh against this working tree --------------------------------------------
# COURSE_FORCE=1: the working tree may have changed since the last check; the stamp goes
# inside the environment, not to ~/.cache.
setup_started=$SECONDS
COURSE_SOURCE="$ROOT" PYTHON="$VENV/bin/python" COURSE_FORCE=1 XDG_CACHE_HOME="$VENV/cache" \
    bash colab_setup.sh
say "colab_setup.sh took $((SECONDS - setup_started)) s"

# The test runner only: nothing a notebook may import, and Colab's IPython and ipykernel
# kept (the pins as a constraint: pip fails rather than replace them).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off \
    -c "$PINS" pytest nbval ipykernel pytest-xdist
"$VENV/bin/python" -c 'import IPython, ipykernel, sys; print("colab-check: kernel: Python %d.%d, IPython %s, ipykernel %s" % (*sys.version_info[:2], IPython.__version__, ipykernel.__version__))'

# --- 3. every notebook, small workload, the installed package -------------------------------
nbval_started=$SECONDS
# shellcheck disable=SC2086
(
    unset PYTHONPATH
    COURSE_WORKLOAD=small "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs \
        -n "${TEST_JOBS:-auto}" --dist loadfile \
        --nbval-lax --nbval-current-env -o addopts= ${NOTEBOOKS:-notebooks/*.ipynb}
)
say "notebooks took $((SECONDS - nbval_started)) s"

# --- 4. the GPU record, rehearsed as on Colab (issue 41) ------------------------------------
# docs/gpu-record.md's Colab line without a GPU: COLAB_RELEASE_TAG in every process's environment
# (the kernels gpu-record starts inherit it, so every setup cell must leave the course as it
# is), Colab's Python and pins; the record must validate, name the commit and have every
# notebook ok (small workload).
if [ "${COLAB_REHEARSE:-0}" != 1 ]; then
    say "colab-check passed in $((SECONDS - started)) s (GPU record rehearsal: COLAB_REHEARSE=1)"
    exit 0
fi
record_started=$SECONDS
rehearsal="$ROOT/build/colab-gpu-record"
rm -rf "$rehearsal"
# nbclient runs the record's notebooks (Colab ships it; the pins kept, as for the test runner)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off \
    -c "$PINS" nbclient
(
    unset PYTHONPATH
    COLAB_RELEASE_TAG=colab-check "$VENV/bin/python" -m course_utils gpu-record --rehearse \
        --out "$rehearsal" --budget-s 1800
) || die "the GPU record's rehearsal failed (see above; the record is in $rehearsal)"
"$VENV/bin/python" - "$rehearsal" <<'PYEOF' || die "the GPU record's rehearsal is not complete"
import sys
from pathlib import Path
from course_utils.records import load_record
(path,) = Path(sys.argv[1]).glob("gpu-record-*.json")
record = load_record(path)  # validates
statuses = {entry["notebook"]: entry["status"] for entry in record["notebooks"]}
assert record["course"]["commit"], "the record names no commit"
assert len(statuses) == len(list(Path("notebooks").glob("*.ipynb"))), statuses
assert set(statuses.values()) == {"ok"}, statuses
print(f"colab-check: GPU record rehearsed: {path.name}, {len(statuses)} notebooks ok")
PYEOF
say "GPU record rehearsal took $((SECONDS - record_started)) s; colab-check passed in $((SECONDS - started)) s"
