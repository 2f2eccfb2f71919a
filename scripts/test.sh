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
exec .venv/bin/python -m pytest "$@"
