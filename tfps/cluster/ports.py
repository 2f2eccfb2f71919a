"""Why a task's address cannot be used: a port another process holds, a name that does not resolve, a host that
does not answer. Imports no TensorFlow; every message says what to check."""

import errno
import socket
import time

from tfps.cluster import config as cluster_lib
from tfps.errors import AddressInUseError
from tfps.errors import ClusterConfigError

_CHECKED = set()  # addresses this process already listens at (a chief may build its strategy twice)


def check_can_listen(config: cluster_lib.ClusterConfig) -> None:
  """Raises `AddressInUseError` if the port of this task's address is taken on this host.

  TensorFlow's gRPC server binds every interface with SO_REUSEPORT, so a second server on a taken port may start and
  silently share the port; this check binds without it first. An unlisted task (no address) has nothing to check,
  and an address checked before in this process is taken by this process itself.
  """
  address = config.address
  if address is None or address in _CHECKED:
    return
  port = int(address.rsplit(":", 1)[1])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted task's TIME_WAIT sockets are fine
    try:
      probe.bind(("0.0.0.0", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        raise
      raise AddressInUseError(address_in_use_message(config)) from None
  _CHECKED.add(address)


def check_resolves(config: cluster_lib.ClusterConfig, timeout_secs: float) -> None:
  """Raises `ClusterConfigError` unless the host name of this task's own address resolves within `timeout_secs`.

  TensorFlow's server listens on every interface whatever its address says, so a task whose name no one can resolve
  would serve forever unreached. The name is retried meanwhile: in Kubernetes a pod's name appears once the pod runs.
  """
  if config.address is None:
    return
  host, port = config.address.rsplit(":", 1)
  deadline = time.monotonic() + timeout_secs
  while True:
    try:
      socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
      return
    except socket.gaierror as e:
      if time.monotonic() >= deadline:
        raise ClusterConfigError(f"task {config.task_type}:{config.task_index} cannot serve at {config.address} "
                                 f"(waited {timeout_secs:g}s): {explain_connect_error(e, host, port)}") from None
      time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def address_in_use_message(config: cluster_lib.ClusterConfig) -> str:
  """The one-line error of a task whose port is taken on its host."""
  port = config.address.rsplit(":", 1)[1]
  return (f"task {config.task_type}:{config.task_index} cannot listen at {config.address}: port {port} is already in "
          f"use on this host; check that no other process (an earlier run of this task?) holds it "
          f"(ss -ltnp 'sport = :{port}') or give the task another port")


def explain_connect_error(error: OSError, host: str, port: str) -> str:
  """Why a connection to `host:port` failed, and what to check, in a few words."""
  if isinstance(error, socket.gaierror):
    return (f"the name {host!r} does not resolve ({error.strerror or error}); check the host name, the DNS or "
            "/etc/hosts of this machine")
  if isinstance(error, NotGrpcError):
    return (f"something listens on port {port} of {host} but it is not a TensorFlow server ({error}); check which "
            f"process holds port {port} there (ss -ltnp 'sport = :{port}') and that the task runs at this address")
  if isinstance(error, ConnectionRefusedError):
    return (f"nothing listens on port {port} of {host} (connection refused); check that the task runs there and was "
            "started with this address")
  reason = "connection timed out" if isinstance(error, socket.timeout) else (error.strerror or str(error))
  return (f"{host} does not answer ({reason}); check that the host is up and reachable from here and that no "
          f"firewall drops port {port}")


def probe(address: str, timeout_secs: float) -> None:
  """Raises `OSError` (`NotGrpcError` for another program) unless a TensorFlow server answers at `address` now, on a
  fresh connection (a silent host times out after `timeout_secs`)."""
  host, port = address.rsplit(":", 1)
  with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_secs) as connection:
    check_speaks_grpc(connection, timeout_secs)


class NotGrpcError(OSError):
  """A task's address accepts TCP connections but does not answer as a gRPC (HTTP/2) server."""


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
HTTP2_SETTINGS = 4


def check_speaks_grpc(connection: socket.socket, timeout_secs: float) -> None:
  """Raises `NotGrpcError` unless the server behind `connection` answers an HTTP/2 preface with a SETTINGS frame, as
  every TensorFlow server does at once; another program on the port would make the chief hang in TensorFlow."""
  connection.settimeout(timeout_secs)
  try:
    connection.sendall(HTTP2_PREFACE)
    header = b""
    while len(header) < 9:
      chunk = connection.recv(9 - len(header))
      if not chunk:
        break
      header += chunk
  except OSError as e:
    raise NotGrpcError(f"no HTTP/2 answer ({e.strerror or 'timed out'})") from None
  if len(header) < 9 or header[3] != HTTP2_SETTINGS:
    raise NotGrpcError(f"answered {header[:9]!r}, not HTTP/2")
