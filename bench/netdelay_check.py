"""Does `TestHosts.delay` delay as asked, and how much traffic can it carry? Two test hosts, a and b, each delayed.

  .venv/bin/python bench/netdelay_check.py                 # delays 0, 2, 10 ms; root, iptables (~1 min)
  .venv/bin/python bench/netdelay_check.py --delays=5 --udp_rates=20000,50000,0

Per delay D on both hosts: the median TCP round trip a -> b -> a (should be 2 x D more than without delay), one
TCP connection's throughput for `--bulk_mb` MB a -> b, and UDP datagrams a -> b offered at each of `--udp_rates`
per second (0: as fast as the sender can) against those that arrived (`tfps.testing.netprobe`). Prints one JSON line
per delay.
"""

import json
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `tfps`

from tfps.testing import hosts as hosts_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import netprobe  # pylint: disable=g-import-not-at-top,wrong-import-position

_DELAYS = flags.DEFINE_list("delays", ["0", "2", "10"], "Delays in ms, on both hosts.")
_BULK_MB = flags.DEFINE_integer("bulk_mb", 100, "MB sent over one TCP connection.", lower_bound=1)
_UDP_RATES = flags.DEFINE_list("udp_rates", ["20000", "0"], "UDP datagrams per second offered (0: flat out).")

def measure(delay_ms: float) -> dict:
  with hosts_lib.TestHosts(["a", "b"]) as hosts:
    server = netprobe.start_server(hosts, "b")
    for name in ("a", "b"):
      hosts.delay(name, delay_ms)
    result = {"delay_ms": delay_ms, "round_trip_ms": round(netprobe.round_trip_ms(hosts, "a", "b"), 3),
              "bulk_mb_per_sec": round(netprobe.probe(hosts, "a", ["bulk", "b", str(_BULK_MB.value)]), 1), "udp": []}
    for rate in _UDP_RATES.value:
      sent = int(netprobe.probe(hosts, "a", ["udp", "b", "3", rate]))
      line = server.stdout.readline().split()  # "udp <count>", 3 s after the last datagram
      result["udp"].append({"offered_per_sec": int(rate) or "flat out", "sent": sent, "arrived": int(line[1])})
  return result


def main(argv):
  del argv
  try:
    delays = [float(d) for d in _DELAYS.value]
    [int(rate) for rate in _UDP_RATES.value]  # pylint: disable=expression-not-assigned
  except ValueError:
    raise app.UsageError(f"--delays ({','.join(_DELAYS.value)}) and --udp_rates ({','.join(_UDP_RATES.value)}) "
                         "must be numbers") from None
  for delay in delays:
    print(json.dumps(measure(delay)), flush=True)


if __name__ == "__main__":
  app.run(main)
