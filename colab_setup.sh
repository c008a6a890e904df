#!/usr/bin/env bash
# colab_setup.sh: install the course package on Google Colab without touching its torch.
#
# The first code cell of every notebook downloads this file and runs it (on Colab only):
#   COURSE_REPO=OWNER/NAME COURSE_REF=REF bash colab_setup.sh
#
# What it does:
#   1. reads the installed torch/torchvision/torchaudio versions and writes a pip
#      constraints file pinning exactly those (Colab's CUDA 12.x build must stay: a PyPI
#      torch targets a newer CUDA and breaks the runtime);
#   2. installs the course package (course-utils) and what Colab lacks (lightning,
#      nvidia-ml-py if `import pynvml` fails) under that constraint;
#   3. checks torch is unchanged and `import course_utils` works, and remembers the
#      source in a stamp file, so a second run in the same runtime (this notebook again, or
#      after a kernel restart) returns at once; on Colab every notebook has its own runtime.
#
# Settings (environment variables):
#   COURSE_REPO, COURSE_REF  the GitHub repository and ref (best a commit) to install the
#                            course package from; the notebook's setup cell passes its own
#                            (written by `python -m course_utils badges`). There are no
#                            defaults: this file is the same in every fork, so the SHA-256
#                            that the setup cell checks it against is too.
#   COURSE_SOURCE            any pip requirement or local path to install instead of
#                            git+https://github.com/$COURSE_REPO.git@$COURSE_REF
#   PYTHON                   the interpreter to install into (default: python3)
#   COURSE_FORCE=1           reinstall even if already set up
#   XDG_CACHE_HOME           where the stamp lives (default: ~/.cache)
set -Eeuo pipefail

COURSE_REPO="${COURSE_REPO:-}"
COURSE_REF="${COURSE_REF:-}"
COURSE_SOURCE="${COURSE_SOURCE:-}"
PYTHON="${PYTHON:-python3}"
COURSE_FORCE="${COURSE_FORCE:-0}"
CACHE_DIR="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/course_utils"
STAMP="$CACHE_DIR/colab_setup.stamp"

ME="colab_setup.sh"
STEP="starting"
TORCH_BEFORE=""
WORK=""

# Quiet pip: no progress bars, no version nagging, no root warning (Colab runs as root).
export PIP_PROGRESS_BAR=off PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PIP_ROOT_USER_ACTION=ignore
PIP_FLAGS=(-q --disable-pip-version-check --progress-bar off)

say() { printf '%s: %s\n' "$ME" "$*"; }
die() {
    printf '%s: error: %s\n' "$ME" "$*" >&2
    exit 1
}

# Any failing command ends here: one line saying which step failed and what torch is now.
on_error() {
    local rc="$1" line="$2" now="" torch_note=""
    # Inside a command substitution: leave the message to the main shell.
    if [ "$BASHPID" != "$$" ]; then exit "$rc"; fi
    trap - ERR
    set +e
    if [ -n "$TORCH_BEFORE" ]; then
        now="$(dist_version torch 2>/dev/null)"
        if [ "$now" = "$TORCH_BEFORE" ]; then
            torch_note="; torch is unchanged ($TORCH_BEFORE)"
        else
            torch_note="; torch changed from $TORCH_BEFORE to ${now:-nothing}: restart the runtime"
        fi
    fi
    printf '%s: error: %s failed (exit %s, line %s)%s; messages above say why, rerun after fixing it\n' \
        "$ME" "$STEP" "$rc" "$line" "$torch_note" >&2
    exit "$rc"
}
trap 'on_error "$?" "$LINENO"' ERR

cleanup() {
    if [ -n "$WORK" ]; then rm -rf -- "$WORK"; fi
}
trap cleanup EXIT

# Small questions to the target interpreter; importlib.metadata only (fast, no torch import).
PROBE='
import importlib.metadata as md, importlib.util as iu, sys
what, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
if what == "version":
    try:
        print(md.version(arg))
    except md.PackageNotFoundError:
        print("")
elif what == "state":  # what the stamp records: interpreter, course-utils and where it is
    spec = iu.find_spec("course_utils")
    try:
        cu = md.version("course-utils")
    except md.PackageNotFoundError:
        cu = ""
    print("python=" + sys.prefix)
    print("course-utils=" + cu + " at " + (spec.origin if spec and spec.origin else "?"))
elif what == "ready":  # exit 0 when course_utils, pynvml and lightning are there
    import course_utils, pynvml  # cheap imports
    if iu.find_spec("lightning") is None:  # importing lightning takes seconds: look only
        sys.exit("no lightning")
elif what == "snapshot":  # name==version of every visible distribution
    seen = {}
    for d in md.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in seen:
            seen[name] = d.version
    print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
elif what == "diff":  # what changed between two snapshots, on one line
    def read(p):
        return dict(l.split("==", 1) for l in open(p).read().split() if "==" in l)
    a, b = read(arg), read(sys.argv[3])
    out = [f"{n} {b[n]}" if n not in a else f"{n} {a[n]} -> {b[n]}"
           for n in sorted(b) if a.get(n) != b[n]]
    out += [f"{n} removed" for n in sorted(set(a) - set(b))]
    print(", ".join(out) if out else "nothing new (same versions reinstalled)")
'
py() { "$PYTHON" -c "$PROBE" "$@"; }
dist_version() { py version "$1"; }

# --- 1. Where to install from, and into which Python --------------------------------------
STEP="reading COURSE_REPO and COURSE_REF"
if [ -z "$COURSE_SOURCE" ]; then
    if [ -z "$COURSE_REPO" ] || [ -z "$COURSE_REF" ]; then
        die "COURSE_REPO and COURSE_REF are not set: run the notebook's first cell, which sets them (or set COURSE_SOURCE)"
    fi
    COURSE_SOURCE="git+https://github.com/${COURSE_REPO}.git@${COURSE_REF}"
fi

STEP="checking PYTHON=$PYTHON"
if ! PYVER="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"; then
    die "cannot run PYTHON=$PYTHON (set PYTHON to the notebook's interpreter)"
fi

# A local path (tests, offline copies): make it absolute, and fail early if it is missing.
case "$COURSE_SOURCE" in
    /* | ./* | ../* | . | ..)
        if [ -d "$COURSE_SOURCE" ]; then
            COURSE_SOURCE="$(cd -- "$COURSE_SOURCE" && pwd)"
        elif [ -f "$COURSE_SOURCE" ]; then
            COURSE_SOURCE="$(cd -- "$(dirname -- "$COURSE_SOURCE")" && pwd)/$(basename -- "$COURSE_SOURCE")"
        else
            die "COURSE_SOURCE=$COURSE_SOURCE does not exist (expected a checkout of the course or a wheel)"
        fi
        ;;
esac
say "python $PYVER ($PYTHON), course source: $COURSE_SOURCE"

# Run every probe from an empty directory, so a course checkout in the current directory
# cannot make `import course_utils` look installed.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/colab_setup.XXXXXX")"
cd -- "$WORK"

STEP="reading the installed torch version"
TORCH_BEFORE="$(dist_version torch)"
if [ -z "$TORCH_BEFORE" ]; then
    die "torch is not installed in $PYTHON; this script keeps an existing torch (Colab's) and never installs one: install torch first (https://pytorch.org/get-started/locally/)"
fi

# --- 2. Already set up? ---------------------------------------------------------------------
STEP="checking for an earlier setup"
WANT_STAMP="source=$COURSE_SOURCE"
if [ "$COURSE_FORCE" != 1 ] && [ -f "$STAMP" ] && py ready >/dev/null 2>&1; then
    STATE="$(py state)"
    if [ "$(cat -- "$STAMP")" = "$WANT_STAMP"$'\n'"$STATE" ]; then
        say "already set up (torch $TORCH_BEFORE, ${STATE##*$'\n'}); COURSE_FORCE=1 reinstalls (in a notebook: %env COURSE_FORCE=1, then the setup cell again)"
        exit 0
    fi
fi

# --- 3. Pin what Colab brought ---------------------------------------------------------------
STEP="checking pip in $PYTHON"
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    die "pip is not available in $PYTHON (try: $PYTHON -m ensurepip)"
fi

STEP="writing the constraints file"
CONSTRAINTS="$WORK/constraints.txt"
PINS=()
for name in torch torchvision torchaudio; do
    version="$(dist_version "$name")"
    if [ -n "$version" ]; then PINS+=("$name==$version"); fi
done
printf '%s\n' "${PINS[@]}" >"$CONSTRAINTS"
say "torch before: $TORCH_BEFORE; keeping ${PINS[*]} (pip constraint)"

EXTRA=(lightning)
if ! "$PYTHON" -c 'import pynvml' >/dev/null 2>&1; then EXTRA+=(nvidia-ml-py); fi

STEP="listing installed packages"
py snapshot >"$WORK/before.txt"

# --- 4. Install --------------------------------------------------------------------------------
# The course package itself is always (re)installed without its dependencies: pip would
# otherwise skip a git source whose version number did not change.
STEP="installing the course package from $COURSE_SOURCE"
say "installing course-utils from $COURSE_SOURCE ..."
"$PYTHON" -m pip install "${PIP_FLAGS[@]}" -c "$CONSTRAINTS" --force-reinstall --no-deps \
    "$COURSE_SOURCE"

# Then what it needs, and what Colab lacks; the constraint keeps torch as it is (pip fails
# rather than replace it).
STEP="installing ${EXTRA[*]} and the course package's dependencies"
say "installing ${EXTRA[*]} and the dependencies of course-utils ..."
"$PYTHON" -m pip install "${PIP_FLAGS[@]}" -c "$CONSTRAINTS" course-utils "${EXTRA[@]}"

STEP="listing installed packages"
py snapshot >"$WORK/after.txt"
say "installed: $(py diff "$WORK/before.txt" "$WORK/after.txt")"

# --- 5. Check ---------------------------------------------------------------------------------
STEP="checking the result"
TORCH_AFTER="$(dist_version torch)"
if [ "$TORCH_AFTER" != "$TORCH_BEFORE" ]; then
    die "torch changed from $TORCH_BEFORE to ${TORCH_AFTER:-nothing} during the install: restart the runtime; if it stays broken, use Runtime > Disconnect and delete runtime"
fi
if ! CU="$("$PYTHON" -c 'import course_utils as c; print(c.__version__, "from", c.__file__)')"; then
    die "the install finished but 'import course_utils' fails in $PYTHON (see the traceback above)"
fi
if ! py ready >/dev/null; then
    die "the install finished but lightning or pynvml cannot be found in $PYTHON"
fi
say "torch after: $TORCH_AFTER (unchanged); course_utils $CU"

STEP="writing the stamp"
if ! { mkdir -p -- "$CACHE_DIR" && printf '%s\n%s\n' "$WANT_STAMP" "$(py state)" >"$STAMP"; }; then
    say "warning: could not write $STAMP; the next run will install again"
fi
say "done. If lightning or course_utils were imported earlier in this runtime, restart the runtime (Runtime > Restart session) before using them."
