#!/usr/bin/env bash
# Runs a control-plane test that needs PyPI packages (test-time only): creates or reuses a venv
# inside the build dir, installs the packages, then runs the command with that venv's python.
# Exits 77 (skip) when the venv or the install is impossible (no network).
# Usage: venv.sh "pkg1 pkg2" SCRIPT ARGS...
set -u
pkgs=$1; shift
venv="${SPOTTRAIN_BUILDDIR:?}/venv-control"
stamp="$venv/.installed-$(echo "$pkgs" | tr ' =<>' '____')"
if [ ! -f "$stamp" ]; then
  python3 -m venv "$venv" >/dev/null 2>&1 || { echo "SKIP: cannot create a venv"; exit 77; }
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --disable-pip-version-check -q $pkgs >"$venv/pip.log" 2>&1 ||
    { tail -5 "$venv/pip.log"; echo "SKIP: pip install $pkgs failed (no network?)"; exit 77; }
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
exec "$venv/bin/python" "$@"
