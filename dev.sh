#!/usr/bin/env bash
# Sets up what each command needs (virtualenv, pinned packages and Delta jars; for the tests also
# the Azure Storage emulator the object-store tests run against and a C compiler), then runs one of:
#   ./dev.sh demo [--root DIR]   the demo pipeline on a local queue manager (./mq-data)
#   ./dev.sh test [PYTEST ARGS]  the full test suite
#   ./dev.sh bench [ARGS]        the benchmarks (JSON on stdout)
#   ./dev.sh chaos [ARGS]        a chaos run (--minutes N --seed S; the report as JSON on stdout)
#   ./dev.sh lint                ruff check, ruff format --check and mypy (fails on any finding)
#   ./dev.sh setup               only the set-up (everything the tests need)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${MQSPARK_VENV:-.venv}"

die() { echo "dev.sh: $*" >&2; exit 1; }

# Python 3.11 to 3.13 (pyproject.toml's requires-python): $PYTHON if set (and nothing else), else the
# first found of these.
find_python() {
    if [ -n "${PYTHON:-}" ]; then
        usable_python "$PYTHON" || die "PYTHON=$PYTHON is not a Python 3.11, 3.12 or 3.13 that runs here"
        return
    fi
    for candidate in python3.11 python3.12 python3.13 python3; do
        usable_python "$candidate" && return
    done
    die "needs Python 3.11, 3.12 or 3.13 (set PYTHON=/path/to/python3)"
}

# Prints the interpreter a command name stands for, if it runs and is 3.11 to 3.13. pyenv's shim for
# pythonX.Y answers only while X.Y is the selected version, so an installed X.Y is looked up too.
usable_python() {
    local name=$1 path
    for path in "$name" $(pyenv_python "$name"); do
        if command -v "$path" >/dev/null 2>&1 &&
           "$path" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
            echo "$path"; return 0
        fi
    done
    return 1
}

# The newest pyenv-installed interpreter for a name like python3.12, if pyenv has one.
pyenv_python() {
    local version=${1#python} root found
    [[ "$version" =~ ^3\.[0-9]+$ ]] && command -v pyenv >/dev/null 2>&1 || return 0
    root=$(pyenv root)
    found=$(ls -d "$root/versions/$version".* 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] && echo "$found/bin/$1"
    return 0
}

# pyspark is published as a source distribution only (400 MB). uv revalidates it on every install,
# the registry here answers "modified", and uv then downloads and builds it again: 30-40 s of each
# virtualenv's set-up. The wheel is built once per machine and version, and the installs take it
# from here. Built beside its final name and renamed, so a set-up running in parallel never sees
# half a wheel.
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/mqspark/wheels"
pyspark_wheel() {
    local version work
    version=$(sed -n 's/^pyspark==//p' requirements.lock)
    compgen -G "$WHEELS/pyspark-$version-*.whl" >/dev/null && return
    mkdir -p "$WHEELS"
    work=$(mktemp -d "$WHEELS/.build-XXXXXX")
    echo "dev.sh: building a wheel of pyspark $version (once)" >&2
    "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$work" "pyspark==$version"
    "$VENV/bin/python" -m uv build --quiet --wheel --out-dir "$work/wheel" "$work"/pyspark-"$version".tar.gz
    mv "$work"/wheel/pyspark-"$version"-*.whl "$WHEELS/"
    rm -rf "$work"
}

setup() {
    command -v java >/dev/null 2>&1 || die "needs Java 17 or newer on PATH (Spark 4 runs on Java 17/21)"
    java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
    [ "${java_major:-0}" -ge 17 ] || die "needs Java 17 or newer, found ${java_major:-unknown}"
    if [ ! -x "$VENV/bin/python" ]; then
        python=$(find_python)
        echo "dev.sh: creating virtualenv $VENV with $("$python" -V) ($python)" >&2
        "$python" -m venv "$VENV"
    fi
    stamp="$VENV/.mqspark-setup"
    wanted=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
        echo "dev.sh: installing pinned packages into $VENV" >&2
        # uv first (pinned too), then uv installs the rest: a third of pip's time. With their bytecode:
        # where PYTHONDONTWRITEBYTECODE is set (container images often set it), Python never writes it,
        # and each of the thousand processes a test run starts (Spark's Python workers among them)
        # compiled pyspark, pyarrow and the rest again, 1.2 s of CPU each.
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c requirements.lock uv
        pyspark_wheel
        "$VENV/bin/python" -m uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" \
            --find-links "$WHEELS" -c requirements.lock -e '.[dev]'
        # uv keeps what it builds and unpacks in its cache: prune drops what no install uses any more,
        # waiting for uv processes that use them.
        "$VENV/bin/python" -m uv cache prune --quiet
        echo "$wanted" > "$stamp"
    fi
    # The project's own bytecode, for the same reason (only what changed since the last run).
    "$VENV/bin/python" -m compileall -q mqspark tests benchmarks chaos > /dev/null
    # And pyspark's, in the zip Spark's Python workers import it from (once; see the script).
    "$VENV/bin/python" tools/zip_bytecode.py
    # Resolves Delta's JVM jars from Maven Central once; later runs reuse the cached jars.
    "$VENV/bin/python" -m mqspark.spark.session > /dev/null
}

# Debian packages, with apt-get (as root, or through sudo).
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "needs $* (install them with your system's package manager)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "dev.sh: installing $* from Debian's packages" >&2
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >&2
}

# What only the tests and the chaos runs use, on top of setup.
setup_tests() {
    setup
    # The C compiler a chaos run builds its clock skew and slow disk with (chaos/faults.c).
    command -v cc >/dev/null 2>&1 || apt_install gcc libc6-dev
    # The browser the console's tests drive, and its driver.
    if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
        apt_install chromium chromium-driver
    fi
    # Azurite and the Node.js it needs, pinned in tools/azurite/package-lock.json, from the npm registry.
    command -v npm >/dev/null 2>&1 || die "needs npm (Node.js) to install the Azure Storage emulator the tests use"
    azurite_stamp=tools/azurite/node_modules/.mqspark-setup
    azurite_wanted=$(sha256sum tools/azurite/package-lock.json | cut -d' ' -f1)
    if [ "$(cat "$azurite_stamp" 2>/dev/null)" != "$azurite_wanted" ]; then
        echo "dev.sh: installing the Azure Storage emulator (Azurite) into tools/azurite" >&2
        npm ci --prefix tools/azurite --no-audit --no-fund --loglevel=error >&2
        echo "$azurite_wanted" > "$azurite_stamp"
    fi
}

# Runs all three checks, then fails if any of them found something.
lint() {
    status=0
    "$VENV/bin/python" -m ruff check mqspark tests benchmarks chaos || status=1
    "$VENV/bin/python" -m ruff format --check mqspark tests benchmarks chaos || status=1
    "$VENV/bin/python" -m mypy || status=1
    return "$status"
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
    setup) setup_tests ;;
    demo) setup; exec "$VENV/bin/python" -m mqspark.demo "$@" ;;
    test) setup_tests; exec "$VENV/bin/python" -m pytest "$@" ;;
    bench) setup; exec "$VENV/bin/python" -m benchmarks "$@" ;;
    chaos) setup_tests; exec "$VENV/bin/python" -m chaos "$@" ;;
    lint) setup; lint ;;
    *) die "usage: ./dev.sh demo|test|bench|chaos|lint|setup [ARGS]" ;;
esac
