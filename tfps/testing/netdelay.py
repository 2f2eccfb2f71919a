"""Network delay without netem: holds every packet an iptables NFQUEUE rule hands it for a fixed time, then lets it go.

For kernels built without the netem qdisc (`tc ... netem delay` fails) but with NFQUEUE (CONFIG_NETFILTER_NETLINK_QUEUE).
Run inside a test host's network namespace, after nothing else there has bound the queue:

    python -m tfps.testing.netdelay --ms=10 [--queue=0]     # prints "ready" once bound, then runs until killed
    iptables -A OUTPUT -o <link> -j NFQUEUE --queue-num 0 --queue-bypass

Pure Python over a netlink socket (no library). Only each packet's metadata comes up (no payload copy; GSO packets
whole), and packets are released with one batch verdict ("every id up to N: accept"), so a burst of packets costs one
message back. A constant delay keeps the packets' order. The program asks for real-time priority (SCHED_FIFO) so
that a loaded machine does not hold packets longer than asked; without it (not root) delays grow with the load.
`TestHosts.delay` starts and stops it.
"""

import argparse
import collections
import errno
import os
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT_BATCH, NFQNL_MSG_CONFIG = 0, 3, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, port id (host byte order)
_ATTR = struct.Struct("=HH")
QUEUE_MAXLEN = 65536
RECEIVE_BUFFER = 16 << 20
RECEIVE_BATCH = 256


class NetDelayError(RuntimeError):
  """The queue could not be bound (no NFQUEUE support, not allowed, or another program holds it)."""


def _attr(kind: int, payload: bytes) -> bytes:
  length = _ATTR.size + len(payload)
  return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
  body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs  # nfgenmsg: family, version, queue (big-endian)
  return _HEADER.pack(_HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _attributes(data: bytes, start: int, end: int):
  while start + _ATTR.size <= end:
    length, kind = _ATTR.unpack_from(data, start)
    if length < _ATTR.size:
      return
    yield kind & 0x3FFF, data[start + _ATTR.size:start + length]
    start += (length + 3) & ~3


class Delayer:
  """Holds the packets of NFQUEUE `queue` for `ms` milliseconds each, in arrival order."""

  def __init__(self, ms: float, queue: int = 0):
    self.delay_secs = ms / 1000
    self.queue = queue
    self.held = collections.deque()  # (due time, packet id), oldest first
    self.packets = 0
    self._seq = 0
    self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
      self.sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE (root), beyond rmem_max
    except OSError:
      self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    self.sock.bind((0, 0))
    self._configure(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
    self._configure(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                    + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)))
    self._configure(_attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
                    + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)))

  def _configure(self, attrs: bytes) -> None:
    """Sends one config message and waits for the kernel's acknowledgement."""
    self._seq += 1
    self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_REQUEST | NLM_F_ACK))
    while True:
      data = self.sock.recv(65536)
      _, kind, _, seq, _ = _HEADER.unpack_from(data)
      if kind == NLMSG_ERROR and seq == self._seq:
        code = -struct.unpack_from("=i", data, _HEADER.size)[0]
        if code:
          hint = ("another program holds this queue, or this process lacks CAP_NET_ADMIN" if code == errno.EPERM
                  else os.strerror(code))
          raise NetDelayError(f"binding NFQUEUE {self.queue} failed: {errno.errorcode.get(code, code)} ({hint})")
        return

  def _receive(self, now: float) -> None:
    """Takes the packets waiting on the socket (at most `RECEIVE_BATCH`, so that due ones are released meanwhile);
    each is due `delay_secs` after now."""
    due = now + self.delay_secs
    for _ in range(RECEIVE_BATCH):
      try:
        data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
      except BlockingIOError:
        return
      except OSError as e:
        if e.errno == errno.ENOBUFS:  # the socket overflowed: the kernel dropped packets (TCP resends them)
          continue
        raise
      offset = 0
      while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
          break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
          for attr, payload in _attributes(data, offset + _HEADER.size + 4, offset + length):
            if attr == NFQA_PACKET_HDR:
              self.held.append((due, struct.unpack_from("!I", payload)[0]))
              self.packets += 1
              break
        offset += (length + 3) & ~3

  def _release(self, now: float) -> None:
    """Accepts, with one batch verdict, every held packet that is due."""
    last = None
    while self.held and self.held[0][0] <= now:
      last = self.held.popleft()[1]
    if last is not None:
      self._seq += 1
      self.sock.send(_message(NFQNL_MSG_VERDICT_BATCH, self.queue,
                              _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last)), self._seq))

  def run(self) -> None:
    """Delays packets until the process is killed."""
    while True:
      timeout = max(0.0, self.held[0][0] - time.monotonic()) if self.held else None
      readable, _, _ = select.select([self.sock], [], [], timeout)
      now = time.monotonic()
      if readable:
        self._receive(now)
      self._release(time.monotonic())


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tfps.testing.netdelay", description=__doc__.split("\n")[0])
  parser.add_argument("--ms", type=float, required=True, help="milliseconds each packet is held")
  parser.add_argument("--queue", type=int, default=0, help="the NFQUEUE number (0-65535)")
  parser.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                      help="run at real-time priority (SCHED_FIFO 1) if allowed")
  args = parser.parse_args(argv)
  if not 0 <= args.ms <= 10_000:
    parser.error(f"--ms ({args.ms}) must be in [0, 10000]")
  if not 0 <= args.queue <= 65535:
    parser.error(f"--queue ({args.queue}) must be in [0, 65535]")
  try:
    delayer = Delayer(args.ms, args.queue)
  except (NetDelayError, OSError) as e:
    print(f"netdelay: {e}", file=sys.stderr)
    return 1
  if args.realtime:
    try:  # woken on time even on a loaded machine; it uses ~1% of a core (measured), so it starves nothing
      os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError as e:
      print(f"netdelay: running without real-time priority ({e.strerror}); delays grow with the machine's load",
            file=sys.stderr)
  print("ready", flush=True)
  try:
    delayer.run()
  except KeyboardInterrupt:
    pass
  return 0


if __name__ == "__main__":
  sys.exit(main())
