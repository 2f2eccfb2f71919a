"""Notices at once that the process of a TensorFlow server has ended, however soon it is started again.

A probe with a fresh connection every few seconds (`ports.probe`) misses a task that a supervisor started again
between two probes, at the same address. This holds one idle HTTP/2 connection open to each server instead, as a gRPC
client would, and answers what the server sends on it (its SETTINGS, a keepalive PING). When the process ends, the
kernel closes its sockets: the connection ends without the GOAWAY frame a live gRPC server sends before it closes a
connection itself. Such an end is reported once: the process that answered there is gone. A connection that cannot
be opened (the server not yet up, a silent host) is tried again at every `wait`; a silent host is never reported.
Imports no TensorFlow.
"""

import selectors
import socket
import struct
import time
from typing import Dict, List, Sequence

from tfps.cluster import ports

_HEADER = 9  # an HTTP/2 frame: 3 bytes length, type, flags, 4 bytes stream id
_PING, _GOAWAY = 6, 7
_ACK = 1


def _frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
  return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + b"\x00\x00\x00\x00" + payload


class _Connection:
  """One held connection: its socket, the bytes of a frame not yet whole, whether the server said GOAWAY."""

  def __init__(self, address: str, timeout_secs: float):
    host, port = address.rsplit(":", 1)
    self.socket = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_secs)
    self.buffer, self.goaway = b"", False
    self.socket.sendall(ports.HTTP2_PREFACE)

  def read(self) -> bool:
    """Reads what arrived and answers it; False once the connection has ended."""
    try:
      data = self.socket.recv(65536)
    except OSError:
      data = b""
    if not data:
      return False
    self.buffer += data
    while len(self.buffer) >= _HEADER:
      length = int.from_bytes(self.buffer[:3], "big")
      if len(self.buffer) < _HEADER + length:
        break
      kind, flags, payload = self.buffer[3], self.buffer[4], self.buffer[_HEADER:_HEADER + length]
      self.buffer = self.buffer[_HEADER + length:]
      try:
        if kind == ports.HTTP2_SETTINGS and not flags & _ACK:
          self.socket.sendall(_frame(ports.HTTP2_SETTINGS, _ACK))
        elif kind == _PING and not flags & _ACK:
          self.socket.sendall(_frame(_PING, _ACK, payload))
      except OSError:
        return False
      self.goaway = self.goaway or kind == _GOAWAY
    return True

  def close(self) -> None:
    self.socket.close()


class ProcessWatch:
  """Holds a connection to each of `addresses` (`host:port` of TensorFlow servers); `wait` says which ended."""

  def __init__(self, addresses: Sequence[str], connect_timeout_secs: float = 2.0):
    self.addresses = list(addresses)
    self.connect_timeout_secs = connect_timeout_secs
    self.connections: Dict[str, _Connection] = {}

  def _connect(self) -> None:
    for address in self.addresses:
      if address not in self.connections:
        try:
          self.connections[address] = _Connection(address, self.connect_timeout_secs)
        except OSError:
          pass  # not up (yet), or silent: tried again at the next wait

  def wait(self, timeout_secs: float) -> List[str]:
    """Waits up to `timeout_secs`; returns the addresses whose server process ended since it was connected."""
    self._connect()
    if not self.connections:
      time.sleep(timeout_secs)
      return []
    with selectors.DefaultSelector() as selector:  # epoll: a process with 1,024 descriptors open is beyond select()
      for address, connection in self.connections.items():
        selector.register(connection.socket, selectors.EVENT_READ, address)
      ready = [key.data for key, _ in selector.select(timeout_secs)]
    gone = []
    for address in ready:
      connection = self.connections[address]
      if not connection.read():
        connection.close()
        del self.connections[address]
        if not connection.goaway:  # the server closing a connection itself says GOAWAY first
          gone.append(address)
    return gone

  def close(self) -> None:
    for connection in self.connections.values():
      connection.close()
    self.connections.clear()
