#!/usr/bin/env bash
# gpu-record-device.sh: the GPU record on a machine that has a GPU and PyTorch but maybe no
# package registry (a lent device machine, a cluster node, a container image), in one slot.
#
# 1. Here, where pip reaches a registry (once; needs no GPU):
#      bash .ci/gpu-record-device.sh prepare [EXTRA_PACKAGE...]
#    downloads into .gpu-wheels/ (git-ignored) the wheels of the notebook runner (IPython,
#    nbclient, nbformat, jupyter_client, ipykernel and everything they need, at the versions
#    installed in PY) for the target's Python (GPU_PY_VERSIONS, default 3.11 3.12 3.13: the
#    runner's IPython needs 3.11 or newer) on x86-64 Linux, plus any EXTRA_PACKAGE the target
#    lacks (e.g. ipywidgets nvidia-ml-py) with its own dependencies except torch, torchvision,
#    triton and the CUDA libraries (those come with the target's torch). It stops with one
#    line and exit 1 when PY lacks a package to carry or when a wheel is missing for one of
#    the versions, and writes the checkout's commit into .gpu-wheels/commit.txt (a copy
#    carried without .git still names it in the record).
# 2. There, from the course's root (the device tool: carry [".gpu-wheels"], timeout_s 600):
#      OUT=/some/dir bash .ci/gpu-record-device.sh [SECONDS] [GPU_RECORD_OPTION...]
#    SECONDS (default $GPU_SLOT_S, else 570) is the time this script is given, all included:
#    the install, the checks, the record's budget (what is left less a margin to stop and
#    pack) and the copying out. If `course_utils.tooling.gpu_record.missing_packages()` names
#    anything, installs exactly that from .gpu-wheels/ into a scratch environment that sees
#    this Python's own packages (torch stays the machine's; nothing else changes, no
#    network), then runs `python -m course_utils gpu-record`, which copies the record to $OUT
#    after every step; at the end $OUT also gets doctor.txt, probes.json, pytest.txt,
#    log.txt, missing.txt and notebooks.tar.gz (at most 8 flat files). Options after SECONDS
#    go to gpu-record (e.g. --rehearse: the whole run on a machine without a GPU).
# Settings (environment): PY (default: .venv/bin/python where there is one, else python3),
# WHEELS (.gpu-wheels), GPU_SLOT_S, GPU_RECORD_ARGS (default: --notebook-timeout-s 240
# --tests-timeout-s 120), GPU_RECORD_NOTEBOOKS (notebooks).
set -u
if [ -z "${PY:-}" ]; then
  if [ "${1:-}" = "prepare" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
WHEELS=${WHEELS:-.gpu-wheels}
RUNNER="ipython nbclient nbformat jupyter-client ipykernel"

if [ "${1:-}" = "prepare" ]; then
  shift
  mkdir -p "$WHEELS"
  # name==version of the runner's closure (and the extras'), as installed in PY
  pins=$("$PY" - $RUNNER "$@" <<'PYEOF'
import re, sys
from importlib import metadata
skip = re.compile(r"^(torch|torchvision|triton|nvidia-(?!ml-py$).*|cuda-.*)$")
wanted = [name.lower().replace("_", "-") for name in sys.argv[1:]]
lacking = []
for name in wanted:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        lacking.append(name)
if lacking:
    print(f"error: prepare copies the versions installed in {sys.executable}, which lacks "
          f"{', '.join(lacking)}: set PY to a Python that has them (the lock's .venv)",
          file=sys.stderr)
    sys.exit(1)
todo, seen = list(wanted), {}
while todo:
    name = todo.pop().lower().replace("_", "-")
    if name in seen or skip.match(name):
        continue
    try:
        seen[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        seen[name] = None
        continue
    for req in metadata.requires(name) or []:
        if "extra ==" not in req:
            todo.append(re.split(r"[<>=!~;\[ (]", req.strip())[0])
print(" ".join(f"{n}=={v}" if v else n for n, v in sorted(seen.items())))
PYEOF
) || exit 1
  echo "downloading into $WHEELS: $pins"
  failed=""
  for version in ${GPU_PY_VERSIONS:-3.11 3.12 3.13}; do  # the target's Python
    # shellcheck disable=SC2086  # one argument per pin
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
      --python-version "$version" --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 --platform any $pins >"$WHEELS/.download-$version.txt" 2>&1 \
      || failed="$failed $version ($(grep -m1 -o 'No matching distribution found for [^ ]*' "$WHEELS/.download-$version.txt" || tail -1 "$WHEELS/.download-$version.txt" | cut -c1-160))"
  done
  git rev-parse HEAD >"$WHEELS/commit.txt" 2>/dev/null || rm -f "$WHEELS/commit.txt"
  if [ -n "$failed" ]; then
    echo "error: $WHEELS does not cover Python$failed: set GPU_PY_VERSIONS to the target's version"
    exit 1
  fi
  echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS (commit $(cat "$WHEELS/commit.txt" 2>/dev/null || echo unknown)): carry it"
  exit 0
fi

START=$SECONDS
SLOT=${GPU_SLOT_S:-570}
case "${1:-}" in [0-9]*) SLOT=$1; shift ;; esac
OUT=${OUT:?set OUT to the folder that comes back}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-record.XXXX)
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 COURSE_PROGRESS=off MPLBACKEND=Agg
say() { echo "== $*" | tee -a "$LOG"; }
say "$(date -u +%FT%TZ) $PY, $SLOT s: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"
if [ -z "${COURSE_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1 && [ -f "$WHEELS/commit.txt" ]; then
  COURSE_COMMIT=$(cat "$WHEELS/commit.txt"); export COURSE_COMMIT  # a copy without .git
fi

if ! missing=$("$PY" -c 'from course_utils.tooling.gpu_record import missing_packages; print(" ".join(missing_packages()))' 2>>"$LOG"); then
  say "error: could not ask $PY what is missing (see log.txt)"; exit 1
fi
echo "${missing:-nothing}" >"$OUT/missing.txt"
if [ -n "$missing" ]; then
  if [ ! -d "$WHEELS" ]; then
    say "error: missing $missing, and no $WHEELS folder to add them from (see prepare above)"; exit 1
  fi
  say "missing: $missing; adding them from $WHEELS into $WORK/env (no network)"
  # A scratch environment that sees PY's own packages (a .pth file: PY may itself be a
  # venv), so that what needs torch (lightning, torchvision) is satisfied by the machine's.
  "$PY" -m venv --without-pip "$WORK/env" >>"$LOG" 2>&1 \
    || { say "error: $PY could not make a scratch environment (see log.txt)"; exit 1; }
  "$PY" -c 'import os, sys, sysconfig; std = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")}
print("\n".join(p for p in sys.path if p and os.path.isdir(p) and p not in std and "lib-dynload" not in p))' \
    >"$(echo "$WORK"/env/lib/python*/site-packages)/machine.pth"
  # shellcheck disable=SC2086
  "$PY" -m pip --python "$WORK/env/bin/python" install --quiet --disable-pip-version-check --no-compile \
    --no-index --find-links "$WHEELS" $missing >>"$LOG" 2>&1 \
    || { say "error: pip could not add $missing from $WHEELS (see log.txt)"; exit 1; }
  PY=$WORK/env/bin/python
fi

# The record's budget: what is left of the slot, less the time to stop (--kill-after),
# tar the notebooks and copy them out.
left=$((SLOT - (SECONDS - START) - 25))
if [ "$left" -lt 60 ]; then say "error: $left s left of $SLOT s for the record: give it more time"; exit 1; fi
say "gpu-record: budget $((left - 5)) s of the $SLOT s given"
# shellcheck disable=SC2086  # the options, one word each
timeout --kill-after=10 "$left" "$PY" -m course_utils gpu-record \
  ${GPU_RECORD_NOTEBOOKS:-notebooks} --out "$WORK/run" --copy-to "$OUT" --budget-s "$((left - 5))" \
  ${GPU_RECORD_ARGS:---notebook-timeout-s 240 --tests-timeout-s 120} "$@" \
  2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
say "gpu-record exit status $status after $((SECONDS - START)) s"
cp "$WORK"/run/gpu-record-*.json "$WORK"/run/doctor.txt "$WORK"/run/probes.json "$WORK"/run/pytest.txt "$OUT"/ 2>/dev/null
[ -d "$WORK/run/notebooks" ] && timeout 10 tar -czf "$OUT/notebooks.tar.gz" -C "$WORK/run" notebooks
exit "$status"
