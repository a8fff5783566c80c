#!/usr/bin/env bash
# Runs a test that needs PyPI packages (test-time only): creates or reuses a venv, installs the
# packages, then runs the command with that venv's python. Exits 77 (skip) when the venv or the
# install is impossible (no network).
# Usage: venv.sh "pkg1 pkg2" SCRIPT ARGS...
#        venv.sh --install "pkg1 pkg2" ["pkg3" ...]
#                                 only make sure each set is installed (scripts/test does this
#                                 for every set before the suites run, so no test's timeout
#                                 pays for a download): one pip run for all the sets missing,
#                                 and where that fails one per set, so that a set that cannot
#                                 install fails alone (its tests then skip)
# The venv is $SPOTTRAIN_TEST_VENV (scripts/test: build-venv/, shared by the plain and the
# sanitizer build), else venv-control/ in the build dir.
#
# pip does not compile the packages' modules to bytecode (--no-compile): the sets hold some
# 600 MB of Python (the clouds' API descriptions, Kubernetes' schemas) that no test imports,
# and Python compiles what a test does import on first use.
set -u
install_only=0
if [ "${1:-}" = --install ]; then install_only=1; shift; fi
venv=${SPOTTRAIN_TEST_VENV:-${SPOTTRAIN_BUILDDIR:?}/venv-control}
stamp() { echo "$venv/.installed-$(echo "$1" | tr ' =<>' '____')"; }
pip_install() { # log, pkgs...
  local log=$1; shift
  "$venv/bin/pip" install --disable-pip-version-check --no-compile -q "$@" >"$log" 2>&1
}
sets=("$@")
[ $install_only = 1 ] || sets=("$1")
# Tests run several at a time: one creates the venv and installs while the others wait.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
missing=()
for s in "${sets[@]}"; do [ -f "$(stamp "$s")" ] || missing+=("$s"); done
if [ ${#missing[@]} -gt 0 ]; then
  [ $install_only = 1 ] && echo "venv.sh: installing ${missing[*]} into $venv" >&2
  python3 -m venv "$venv" >/dev/null 2>&1 || { echo "SKIP: cannot create a venv"; exit 77; }
  # shellcheck disable=SC2046,SC2086
  if pip_install "$venv/pip.log" $(printf '%s ' "${missing[@]}"); then
    for s in "${missing[@]}"; do touch "$(stamp "$s")"; done
  else
    failed=0
    for s in "${missing[@]}"; do
      # shellcheck disable=SC2086
      if [ ${#missing[@]} -gt 1 ] && pip_install "$venv/pip.log" $s; then
        touch "$(stamp "$s")"
      else
        tail -5 "$venv/pip.log"
        echo "SKIP: pip install $s failed (no network?)"
        failed=1
      fi
    done
    [ $failed = 0 ] || exit 77
  fi
fi
flock -u 9
exec 9>&-
[ $install_only = 1 ] && exit 0
shift
export PATH="$venv/bin:$PATH"
exec "$venv/bin/python" "$@"
