"""A network probe between test hosts: TCP round trips, one connection's throughput, UDP datagrams that arrive.

Used by `tests/test_host_delay.py` and `bench/netdelay_check.py` to check `TestHosts.delay`. Both ends run at
real-time priority when `chrt` exists (as the delayer does), so that the machine's load blurs the figures less.

    server = netprobe.start_server(hosts, "b")
    netprobe.round_trip_ms(hosts, "a", "b")                  # median, ms
    netprobe.probe(hosts, "a", ["bulk", "b", "100"])         # MB/s over one TCP connection
"""

import shutil
import subprocess
import sys
from typing import Sequence

PORT = 7000
REALTIME = ["chrt", "-f", "1"] if shutil.which("chrt") else []
# `serve`: answers every TCP message; counts UDP datagrams until 3 s without one. `ping HOST N`: median round trip
# (ms) of N messages. `bulk HOST MB`: MB/s over one connection. `udp HOST SECS RATE`: datagrams sent.
PROBE = """
import socket, statistics, sys, threading, time
mode, args = sys.argv[1], sys.argv[2:]
if mode == "serve":
  def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", PORT))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24); s.settimeout(None); n = 0
    while True:
      s.recv(64); n += 1; s.settimeout(3)
      try:
        while True:
          s.recv(64); n += 1
      except socket.timeout:
        print("udp", n, flush=True); n = 0; s.settimeout(None)
  threading.Thread(target=udp, daemon=True).start()
  server = socket.create_server(("0.0.0.0", PORT)); print("listening", flush=True)
  while True:
    conn, _ = server.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (data := conn.recv(1 << 20)):
      if data.startswith(b"p") and len(data) <= 64:
        conn.sendall(data)
      elif data.endswith(b"E"):
        conn.sendall(b"k")
elif mode == "ping":
  conn = socket.create_connection((args[0], PORT), timeout=10)
  conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); times = []
  for _ in range(int(args[1])):
    start = time.perf_counter(); conn.sendall(b"ping"); conn.recv(64); times.append(time.perf_counter() - start)
  print(1000 * statistics.median(times))
elif mode == "bulk":
  conn = socket.create_connection((args[0], PORT), timeout=60); mb = int(args[1]); chunk = b"x" * (1 << 20)
  start = time.perf_counter()
  for _ in range(mb - 1):
    conn.sendall(chunk)
  conn.sendall(chunk[:-1] + b"E"); conn.recv(1)
  print(mb / (time.perf_counter() - start))
else:
  s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); end = time.monotonic() + float(args[1]); rate = float(args[2])
  n = 0
  while time.monotonic() < end:
    for _ in range(100):
      s.sendto(b"x" * 16, (args[0], PORT)); n += 1
    if rate:
      time.sleep(100 / rate)
  print(n)
""".replace("PORT", str(PORT))


def start_server(hosts, name: str) -> subprocess.Popen:
  """The probe's server on host `name` (TCP echo and UDP counter); returns once it listens."""
  server = hosts.popen(name, [*REALTIME, sys.executable, "-c", PROBE, "serve"], stdout=subprocess.PIPE, text=True)
  if server.stdout.readline().strip() != "listening":
    raise RuntimeError(f"the probe's server on {name} did not start")
  return server


def probe(hosts, client: str, args: Sequence[str], timeout: float = 120) -> float:
  """Runs the probe's client on host `client` (`ping HOST N`, `bulk HOST MB`, `udp HOST SECS RATE`); its number."""
  result = hosts.run(client, [*REALTIME, sys.executable, "-c", PROBE, *args], timeout=timeout)
  if result.returncode != 0:
    raise RuntimeError(f"probe {args[0]} on {client} failed: {result.stderr.strip()[-500:]}")
  return float(result.stdout)


def round_trip_ms(hosts, client: str, server: str, count: int = 40) -> float:
  """The median TCP round trip (ms) from `client` to `server` (whose probe server runs) and back."""
  return probe(hosts, client, ["ping", server, str(count)])
