#!/usr/bin/env bash
# Runs a control-plane test that needs PyPI packages (test-time only): creates or reuses a venv
# inside the build dir, installs the packages, then runs the command with that venv's python.
# Exits 77 (skip) when the venv or the install is impossible (no network).
# Usage: venv.sh "pkg1 pkg2" SCRIPT ARGS...
set -u
pkgs=$1; shift
venv="${SPOTTRAIN_BUILDDIR:?}/venv-control"
stamp="$venv/.installed-$(echo "$pkgs" | tr ' =<>' '____')"
# Tests run several at a time: one creates the venv and installs while the others wait.
mkdir -p "$SPOTTRAIN_BUILDDIR"
exec 9>"$SPOTTRAIN_BUILDDIR/venv-control.lock"
flock 9
if [ ! -f "$stamp" ]; then
  python3 -m venv "$venv" >/dev/null 2>&1 || { echo "SKIP: cannot create a venv"; exit 77; }
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --disable-pip-version-check -q $pkgs >"$venv/pip.log" 2>&1 ||
    { tail -5 "$venv/pip.log"; echo "SKIP: pip install $pkgs failed (no network?)"; exit 77; }
  touch "$stamp"
fi
flock -u 9
exec 9>&-
export PATH="$venv/bin:$PATH"
exec "$venv/bin/python" "$@"
