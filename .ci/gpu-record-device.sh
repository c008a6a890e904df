#!/usr/bin/env bash
# gpu-record-device.sh: the GPU record on a machine that has a GPU and PyTorch but maybe no
# package registry (a lent device machine, a cluster node, a container image), in one slot.
#
# 1. Here, where pip reaches a registry (once; needs no GPU):
#      bash .ci/gpu-record-device.sh prepare [EXTRA_PACKAGE...]
#    downloads into .gpu-wheels/ (git-ignored) the wheels of the notebook runner (nbclient,
#    nbformat, jupyter_client, ipykernel and everything they need, at the versions installed
#    here) for the target machine's Python (GPU_PY_VERSIONS: 3.10 to 3.13) on x86-64 Linux,
#    plus any EXTRA_PACKAGE the target lacks (e.g. lightning nvidia-ml-py) with its own
#    dependencies except torch and the CUDA libraries. No torch is carried: the record
#    measures the torch that is there.
# 2. There, from the course's root (the device tool: carry [".gpu-wheels"], timeout_s 600):
#      OUT=/some/dir bash .ci/gpu-record-device.sh
#    If `course_utils.gpu_record.missing_packages()` names anything, installs exactly that
#    from .gpu-wheels/ into a scratch folder (nothing else on the machine changes, no
#    network), then runs `python -m course_utils gpu-record` within GPU_RECORD_SECONDS (570:
#    a 9-minute budget, --budget-s 540, plus the time to stop) and copies to $OUT at most 6
#    flat files: the record (gpu-record-*.json), doctor.txt, pytest.txt, log.txt, missing.txt
#    and notebooks.tar.gz (the executed notebooks). The record is rewritten after every
#    notebook, so a slot that ends early still returns a partial, valid record.
# Settings (environment): PY (default: python3), WHEELS (.gpu-wheels), GPU_RECORD_SECONDS,
# GPU_RECORD_ARGS (default: --budget-s 540 --notebook-timeout-s 240 --tests-timeout-s 120),
# GPU_RECORD_NOTEBOOKS (notebooks).
set -u
PY=${PY:-python3}
WHEELS=${WHEELS:-.gpu-wheels}

if [ "${1:-}" = "prepare" ]; then
  shift
  mkdir -p "$WHEELS"
  # name==version of the runner's closure (and the extras'), as installed here
  pins=$("$PY" - "$@" <<'PYEOF'
import re, sys
from importlib import metadata
skip = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")
todo, seen = ["nbclient", "nbformat", "jupyter-client", "ipykernel", *sys.argv[1:]], {}
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
  for version in ${GPU_PY_VERSIONS:-3.10 3.11 3.12 3.13}; do  # the target's Python is unknown
    # shellcheck disable=SC2086  # one argument per pin
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
      --python-version "$version" --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 --platform any $pins 2>&1 | grep -v "^WARNING: Location" \
      || true
  done
  echo "$(ls "$WHEELS" | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS: carry it"
  exit 0
fi

OUT=${OUT:?set OUT to the folder that comes back}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-record.XXXX)
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 COURSE_PROGRESS=off MPLBACKEND=Agg
say() { echo "== $*" | tee -a "$LOG"; }
say "$(date -u +%FT%TZ) $PY: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"

missing=$("$PY" -c 'from course_utils.gpu_record import missing_packages; print(" ".join(missing_packages()))' 2>>"$LOG")
echo "${missing:-nothing}" >"$OUT/missing.txt"
if [ -n "$missing" ]; then
  if [ ! -d "$WHEELS" ]; then
    say "missing: $missing, and no $WHEELS folder to add them from (see prepare above)"; exit 1
  fi
  say "missing: $missing; adding them from $WHEELS into $WORK/site (no network)"
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$WORK/site" $missing \
    >>"$LOG" 2>&1 || { say "pip could not add them from $WHEELS (see above)"; exit 1; }
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi

# shellcheck disable=SC2086  # the options, one word each
timeout --kill-after=10 "${GPU_RECORD_SECONDS:-570}" "$PY" -m course_utils gpu-record \
  ${GPU_RECORD_NOTEBOOKS:-notebooks} --out "$WORK/run" \
  ${GPU_RECORD_ARGS:---budget-s 540 --notebook-timeout-s 240 --tests-timeout-s 120} \
  2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
say "gpu-record exit status $status"
cp "$WORK"/run/gpu-record-*.json "$WORK"/run/doctor.txt "$WORK"/run/pytest.txt "$OUT"/ 2>/dev/null
[ -d "$WORK/run/notebooks" ] && tar -czf "$OUT/notebooks.tar.gz" -C "$WORK/run" notebooks
exit "$status"
