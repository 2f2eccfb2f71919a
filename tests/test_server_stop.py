"""A ps or worker task stops at once on SIGTERM or SIGINT, with status 0 (its server serves from TensorFlow's threads)."""

import pathlib
import signal
import subprocess
import sys
import time

import portpicker
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("job,signum,spinning", [("ps", signal.SIGTERM, False), ("worker", signal.SIGINT, True)])
def test_a_server_task_exits_with_status_0_soon_after_a_signal(tmp_path, job, signum, spinning):
  ps, worker, chief = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(3))
  log = tmp_path / "task.log"
  with open(log, "wb") as out:
    task = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), f"--ps_hosts={ps}",
                             f"--worker_hosts={worker}", f"--chief_hosts={chief}", f"--job_name={job}", "--task_index=0",
                             f"--thread_spinning={spinning}"],
                            cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 120
    while "Serving" not in log.read_text() and time.monotonic() < deadline and task.poll() is None:
      time.sleep(0.2)
    assert "Serving" in log.read_text(), log.read_text()
    assert f"(idle threads {'spin' if spinning else 'sleep'})" in log.read_text()  # --thread_spinning reached it
    sent = time.monotonic()
    task.send_signal(signum)
    assert task.wait(timeout=30) == 0
    assert time.monotonic() - sent < 5  # tfps-launch's default grace before SIGKILL
    assert f"Received signal {signum}; stopping the server" in log.read_text()
  finally:
    task.kill()
    task.wait()
