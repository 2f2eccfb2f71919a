#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite (slow tests included). Arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
# The many-host tests drop packets with iptables inside network namespaces (root only; a fresh CI machine lacks it).
if [ "$(id -u)" = 0 ] && ! command -v iptables >/dev/null && command -v apt-get >/dev/null; then
  apt-get install -y -qq iptables >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq iptables) >/dev/null \
    || echo "test.sh: iptables could not be installed; the tests that drop packets will say so" >&2
fi
# Under CI=true a test whose tool, data or privilege is missing fails (tests/needs.py): provide them. The shared data
# (MovieLens 100K, the Criteo sample) is read from ../shared/data; fetched there from its public sources if absent.
if [ "${CI:-}" = true ]; then
  bash "$root/scripts/fetch_test_data.sh" "$root/../shared/data"
  [ "$(id -u)" = 0 ] || echo "test.sh: CI=true without root: the tests on test hosts (network namespaces) will fail" >&2
fi
# Three test files at a time (pytest-xdist; a file's tests stay in one process, in order): fewer leave a core idle
# while tests wait on restarts, timeouts and network delays (887 tests: 11 min 59 s, 1.89 cores busy, against 12 min
# 57 s two at a time, 1.67 cores busy). On 2 quiet cores, from a fresh clone with CI=true, 2026-11-29: 1,037 tests in
# 14 min 11 s (1,649 CPU-s, 1.84 cores busy); the same tests took up to 23 min when the machine was loaded.
# `bash scripts/test.sh -n 0` runs one file at a time.
# Files start in the order tests/conftest.py collects them, longest first (xdist's own order, most tests first, started
# the longest files last). -rs: each skip with its reason.
exec .venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -rs "$@"
