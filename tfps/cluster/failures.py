"""A training cluster task lost mid-run, said in one line: which task, its address, what to check.

TensorFlow reports a lost ps as an `UnavailableError` whose text names the task (`/job:ps/replica:0/task:1`) among
pages of gRPC detail; the chief then cannot go on without a restart from its last checkpoint. A ps already started
again when the chief next reaches it answers that what the chief made there is gone (an `InvalidArgumentError` or
`AbortedError` naming the task); the chief cannot go on either.
"""

import re
from typing import Optional

from tfps.cluster import config as cluster_lib

_TASK = re.compile(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)")
_SHOWN_CHARS = 160
# What TensorFlow writes before the cause: a graph function's header, the node and the Python frames that defined it,
# the count of an error with several roots; each root's cause is numbered and coded (`(0) UNAVAILABLE:  ...`)
_HEADER = re.compile(r"Graph execution error:|Detected at node .* defined at \(most recent call last\):|"
                     r"<stack traces unavailable>|\d+ root error\(s\) found\.")
_FRAME = re.compile(r"\s+File \".*\", line \d+, in .*|\s{4}.*")
_NODE_TAG = re.compile(r"\{\{[^}]*\}\}\s*")
_ROOT_NUMBER = re.compile(r"^\(\d+\) [A-Z_]+:\s+")
# What a task started again answers about what the chief made on its previous process (TensorFlow 2.21)
_RESTARTED = ("Unable to find the relevant tensor remote_handle", "Unable to find a context_id")


def describe_lost_task(error: BaseException, config: cluster_lib.ClusterConfig) -> Optional[str]:
  """The one-line message for `error` if it is TensorFlow's `UnavailableError` naming a task of `config`, or its
  error about a task started again (module docstring), else None.

  A ps named anywhere in the text is the one reported (a worker's error often relays the ps it could not reach).
  """
  text = getattr(error, "message", None) or str(error)
  restarted = type(error).__name__ in ("InvalidArgumentError", "AbortedError") and any(
      marker in text for marker in _RESTARTED)
  if type(error).__name__ != "UnavailableError" and not restarted:
    return None
  named = _TASK.findall(text)
  if not named:
    return None
  job, index = next(((job, index) for job, index in named if job == "ps"), named[0])
  index = int(index)
  hosts = config.hosts(job)
  address = hosts[index] if index < len(hosts) else "(not in the cluster)"
  detail = cause(text)
  if restarted:
    return (f"task {job}:{index} at {address} was started again and no longer has what this task made there "
            f"({detail}); start this task again: it resumes from the last checkpoint")
  return (f"task {job}:{index} at {address} became unreachable ({detail}); check that it runs and that its host is "
          "reachable, then start this task again: it resumes from the last checkpoint")


def cause(text: str) -> str:
  """The first line of TensorFlow's error `text` that says what went wrong, at most 160 characters.

  A graph function's error begins with `Graph execution error:`, an empty line and the Python frames that defined the
  failing node; the cause (e.g. gRPC's `failed to connect to all addresses; ...`) comes after them, after `2 root
  error(s) found.` and numbered (`(0) UNAVAILABLE:  failed to connect ...`) where the function failed twice at once.
  """
  lines = (_ROOT_NUMBER.sub("", _NODE_TAG.sub("", line).strip()) for line in text.splitlines()
           if not _FRAME.fullmatch(line) and not _HEADER.fullmatch(line.strip()))
  detail = " ".join(next((line for line in lines if line), "no detail given").split())
  return detail[:_SHOWN_CHARS] + "..." if len(detail) > _SHOWN_CHARS else detail
