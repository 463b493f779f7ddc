#!/usr/bin/env bash
# The build of AppBridge into a virtual environment: the steps of `make install`, as a script that
# the Dockerfile's builder stage runs and tests/unit/test_deploy_kit.py runs too (docs/deploy.md).
#
#   bash deploy/docker/build-steps.sh VENV [SOURCE_DIR]
#
# VENV is created if missing. SOURCE_DIR (default: the repository this script is in) is built
# as it is, not installed in editable mode, so the venv can be copied away from it. PYTHON picks
# the interpreter that creates the venv (default: python3.11, else python3).
set -euo pipefail

venv=${1:?usage: build-steps.sh VENV [SOURCE_DIR]}
src=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip

# The runtime dependencies before the build: mypyc checks the compiled modules against them.
"$venv/bin/python" "$src/deploy/install-deps.py"

# One build, in the environment that already has the dependencies (setup.py compiles the media
# path with mypyc); then a check that no listed module was left interpreted.
"$venv/bin/pip" install -q --no-deps --no-build-isolation "$src"
cd /  # import the installed package, not a source tree in the current directory
# pip writes a wheel's files with the time of the install, a module's source sometimes after its
# extension; both come from this one build, so the extensions are dated after them for the
# staleness check (appbridge/compiled.py), which is meant for editable trees.
package=$("$venv/bin/python" -c 'import appbridge, os; print(os.path.dirname(appbridge.__file__))')
find "$package" -name '*.so' -exec touch {} +
"$venv/bin/python" -m appbridge.compiled
