"""The processes a test started, found by the mark in their environment (TFPS_TEST_MARK), and their removal.

By the mark alone, never by command line: other test files run beside a test (pytest-xdist) and start the same
scripts, and a test must neither count nor kill their processes.
"""

import psutil

MARK = "TFPS_TEST_MARK"


def marked(mark):
  """Live processes (any depth) started with MARK=`mark` in their environment, zombies left out."""
  found = []
  for process in psutil.process_iter(["environ"]):
    try:
      if (process.info["environ"] or {}).get(MARK) == str(mark) and process.status() != psutil.STATUS_ZOMBIE:
        found.append(process)
    except psutil.Error:  # ended, or not ours to read, since it was listed
      continue
  return found


def kill_marked(mark):
  """SIGKILLs every process `marked(mark)` lists; one that has ended meanwhile is left alone."""
  for process in marked(mark):
    try:
      process.kill()
    except psutil.NoSuchProcess:
      continue


def end_launch(launcher, mark) -> list:
  """After a test's launch (`launcher`, a `subprocess.Popen`, started with MARK=`mark`): returns the processes still
  `marked(mark)` (left behind), SIGKILLs them, and kills and reaps the launcher where it still runs."""
  left = marked(mark)
  kill_marked(mark)
  if launcher.poll() is None:
    launcher.kill()
    launcher.wait()
  return left
