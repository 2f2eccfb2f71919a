"""`tfps.cluster.process_watch` against HTTP/2 servers played by a thread: a connection that ends without GOAWAY is a
process gone (reported once, at once), one the server ends with GOAWAY is not; the watch answers SETTINGS and PING as a
gRPC client does, and connects again to a server started again at the same port. A real TensorFlow server's end is
in `tests/test_k8s_runs.py` (a ps killed; its workers exit 3 and are started again)."""

import socket
import threading
import time

import pytest

from tfps.cluster import process_watch

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class FakeServer:
  """Accepts connections on loopback; each gets SETTINGS, and what the test sends through `connections`."""

  def __init__(self, port=0):
    self.listener = socket.socket()
    self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self.listener.bind(("127.0.0.1", port))
    self.listener.listen()
    self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
    self.connections = []
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      try:
        connection, _ = self.listener.accept()
      except OSError:
        return
      connection.sendall(SETTINGS)
      self.connections.append(connection)

  def received(self, connection, size):
    connection.settimeout(5)
    data = b""
    while len(data) < size:
      data += connection.recv(size - len(data))
    return data

  def stop(self):
    self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: else the port stays taken
    self.listener.close()
    for connection in self.connections:
      connection.close()


def connected(watch, server):
  deadline = time.monotonic() + 5
  while not server.connections:
    assert watch.wait(0.05) == [] and time.monotonic() < deadline
  return server.connections[-1]


@pytest.fixture
def server():
  made = FakeServer()
  yield made
  made.stop()


def test_a_connection_ended_without_goaway_is_reported_once_and_at_once(server):
  watch = process_watch.ProcessWatch([server.address, "127.0.0.1:1"])  # nothing listens at port 1: never reported
  connection = connected(watch, server)
  assert server.received(connection, len(PREFACE) + 9) == PREFACE + SETTINGS
  assert server.received(connection, 9) == SETTINGS_ACK  # the server's SETTINGS acknowledged
  assert watch.wait(0.2) == []
  connection.close()  # what the kernel does when the process ends
  start = time.monotonic()
  assert watch.wait(10) == [server.address]
  assert time.monotonic() - start < 2
  assert watch.wait(0.2) == []
  watch.close()


def test_a_server_that_says_goaway_before_closing_is_not_gone(server):
  watch = process_watch.ProcessWatch([server.address])
  connection = connected(watch, server)
  connection.sendall(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + b"\x00" * 8)  # GOAWAY: last stream 0, no error
  connection.close()
  deadline = time.monotonic() + 2
  while time.monotonic() < deadline:
    assert watch.wait(0.1) == []
  assert len(server.connections) == 2  # connected again
  watch.close()


def test_a_ping_is_answered_and_a_server_started_again_is_followed():
  first = FakeServer()
  watch = process_watch.ProcessWatch([first.address])
  connection = connected(watch, first)
  first.received(connection, len(PREFACE) + 18)
  # a PING sent in two pieces (a frame split across reads) gets its ACK with the same 8 bytes
  connection.sendall(b"\x00\x00\x08\x06\x00\x00\x00\x00")
  assert watch.wait(0.1) == []
  connection.sendall(b"\x00" + b"12345678")
  assert watch.wait(0.5) == []
  assert first.received(connection, 17) == b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + b"12345678"
  port = int(first.address.rsplit(":", 1)[1])
  first.stop()
  assert watch.wait(5) == [first.address]
  again = FakeServer(port)  # started again at once, at the same address
  try:
    connected(watch, again)
    again.connections[-1].close()
    assert watch.wait(5) == [first.address]  # its end is reported too
  finally:
    watch.close()
    again.stop()
