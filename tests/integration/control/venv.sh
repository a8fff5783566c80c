#!/usr/bin/env bash
# Runs a test that needs PyPI packages (test-time only): creates or reuses a venv, installs the
# packages, then runs the command with that venv's python. Exits 77 (skip) when the venv or the
# install is impossible (no network).
# Usage: venv.sh "pkg1 pkg2" SCRIPT ARGS...
#        venv.sh --install "pkg1 pkg2"     only make sure they are installed (scripts/test
#                                          does this for every set before the suites run, so
#                                          no test's timeout pays for a download)
# The venv is $SPOTTRAIN_TEST_VENV (scripts/test: build-venv/, shared by the plain and the
# sanitizer build), else venv-control/ in the build dir.
set -u
install_only=0
if [ "${1:-}" = --install ]; then install_only=1; shift; fi
pkgs=$1; shift
venv=${SPOTTRAIN_TEST_VENV:-${SPOTTRAIN_BUILDDIR:?}/venv-control}
stamp="$venv/.installed-$(echo "$pkgs" | tr ' =<>' '____')"
# Tests run several at a time: one creates the venv and installs while the others wait.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$stamp" ]; then
  [ $install_only = 1 ] && echo "venv.sh: installing $pkgs into $venv" >&2
  python3 -m venv "$venv" >/dev/null 2>&1 || { echo "SKIP: cannot create a venv"; exit 77; }
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --disable-pip-version-check -q $pkgs >"$venv/pip.log" 2>&1 ||
    { tail -5 "$venv/pip.log"; echo "SKIP: pip install $pkgs failed (no network?)"; exit 77; }
  touch "$stamp"
fi
flock -u 9
exec 9>&-
[ $install_only = 1 ] && exit 0
export PATH="$venv/bin:$PATH"
exec "$venv/bin/python" "$@"
