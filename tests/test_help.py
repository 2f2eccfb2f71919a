"""Every program's --help lists its own flags with their one-line descriptions (absl key flags)."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# program -> flags its --help must list, with a word of each one's description
PROGRAMS = {
    ("-m", "tfps.cluster.launch"): {"num_ps": "Parameter servers", "evaluator": "sidecar evaluator",
                                    "log_dir": "One log file per task", "verbose": "C++ info lines",
                                    "max_restarts": "Restarts"},
    ("-m", "tfps.cluster.config_cli"): {"ps_hosts": "host:port", "job_name": "This task's job",
                                        "task_index": "index"},
    ("-m", "tfps.report.cli"): {"out": "PNG file"},
    ("-m", "tfps.cluster.k8s_cli"): {"image": "Container image", "claim": "PersistentVolumeClaim", "kind": "TFJob"},
    ("scripts/generate_data.py",): {"output_dir": "Directory", "rows": "Total rows"},
    ("scripts/train.py",): {"model_dir": "Checkpoints", "epochs": "Epochs", "ps_hosts": "host:port",
                            "sync_mode": "workers' work", "model": "Model to train", "batch_size": "per batch"},
    ("scripts/train_keras.py",): {"model_dir": "Checkpoints", "job_name": "This task's job",
                                  "geo_steps": "local steps"},
    ("scripts/train_estimator.py",): {"max_steps": "global step", "worker_hosts": "host:port",
                                      "replicas_to_aggregate": "worker batches", "seed": "tf_random_seed"},
    ("scripts/sidecar_eval.py",): {"model_dir": "training run", "best_metric": "best checkpoint",
                                   "data": "Data source"},
}


@pytest.mark.slow  # the training scripts import TensorFlow
def test_every_program_help_lists_its_flags():
  runs = {program: subprocess.Popen([sys.executable, *program, "--help"], cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
          for program in PROGRAMS}
  try:
    for program, expected in PROGRAMS.items():
      out, _ = runs[program].communicate(timeout=180)
      assert runs[program].returncode in (0, 1), (program, out)  # absl's --help exits with 1
      for name, words in expected.items():
        entry = [line for line in out.splitlines() if line.startswith((f"  --{name}:", f"  --[no]{name}:"))]
        assert entry, (program, name, out)
        description = " ".join((entry[0] + out.split(entry[0], 1)[1].split("\n  --")[0]).split())
        assert words in description, (program, name, description)
      assert "--verbosity" not in out and "--logtostderr" not in out, (program, out)  # not absl's own flags
  finally:
    for process in runs.values():
      if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.parametrize("module,usage", [("launch", "usage: tfps-launch [flags] SCRIPT [-- SCRIPT_ARGS]\n"),
                                          ("report", "usage: tfps-report MODEL_DIR [--out FILE.png] [--serving DIR]\n")])
def test_a_console_scripts_help_begins_with_its_usage(module, usage):
  """Run as the installed command runs it, from a wrapper without a docstring (absl's help would then begin
  `USAGE: program [flags]`, without the arguments it needs)."""
  result = subprocess.run([sys.executable, "-c", f"from tfps.cli import {module}; {module}.run()", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
  assert result.stdout.startswith(usage), result.stdout[:1000]
