"""bench/runner.py: a process run alone whose measured windows are shorter than the sampling period still gets its
CPU (its own count)."""

import json
import pathlib
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

# A benchmark that burns CPU for 50 ms inside its measured span, counts it itself, and writes its JSON.
_BENCHMARK = textwrap.dedent("""\
    import json, os, sys, time
    path = sys.argv[-1].split("=", 1)[1]
    time.sleep(1.0)  # long enough for samples before the span
    start, cpu = time.time(), sum(os.times()[:2])
    while time.time() - start < 0.05:
      pass
    end = time.time()
    cores = (sum(os.times()[:2]) - cpu) / (end - start)
    with open(path, "w") as out:
      json.dump({"measured_span": [start, end], "process_cores": cores}, out)
    time.sleep(0.6)
    """)


def test_a_short_window_alone_gets_the_process_own_cpu(tmp_path):
  script = tmp_path / "bench.py"
  script.write_text(_BENCHMARK)
  result = runner.run([], log_dir=str(tmp_path / "logs"), script=str(script), timeout_secs=60)
  single = result["tasks"]["single:0"]
  assert single["peak_rss_bytes"] > 0
  assert single["cores"] == result["process_cores"] > 0.3  # a busy loop: most of a core
