"""Cluster from absl flags, from TF_CONFIG, and the rules between the two."""

import json
import pathlib
import re
import subprocess
import sys

from absl import flags
import pytest

from tfps import flags as flags_lib
from tfps.errors import ClusterConfigError, UsageError

REPO = pathlib.Path(__file__).resolve().parents[1]
TF_CONFIG = json.dumps({"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]},
                        "task": {"type": "worker", "index": 1}})


def parse(*args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["prog", *args])
  return flag_values


def test_flags_build_the_cluster_with_spaces_after_commas():
  config = flags_lib.config_from_flags(
      parse("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223, 127.0.0.1:2224", "--job_name=worker",
            "--task_index=1"), environ={})
  assert config.worker_hosts == ("127.0.0.1:2223", "127.0.0.1:2224")
  assert config.to_tf_config()["task"] == {"type": "worker", "index": 1}


def test_flagfile_from_configs():
  config = flags_lib.config_from_flags(
      parse(f"--flagfile={REPO / 'configs' / 'cluster_local.cfg'}", "--job_name=chief"), environ={})
  assert config.chief_hosts == ("127.0.0.1:2225",) and config.num_workers == 2 and config.address == "127.0.0.1:2225"


def test_server_options_come_from_the_flags():
  assert flags_lib.server_options_from_flags(parse()) == {"thread_spinning": False,  # idle threads sleep
                                                           "lost_chief_timeout_secs": 600.0,
                                                           "connect_timeout_secs": 60.0}
  assert flags_lib.server_options_from_flags(parse("--thread_spinning", "--lost_chief_timeout_secs=20",
                                                   "--connect_timeout_secs=5")) == {
      "thread_spinning": True, "lost_chief_timeout_secs": 20.0, "connect_timeout_secs": 5.0}
  assert flags_lib.server_options_from_flags(flags.FlagValues()) == {}


def _mode(*args):
  flag_values = flags.FlagValues()
  flags_lib.define_mode_flags(flag_values)
  flag_values(["prog", *args])
  return flags_lib.mode_from_flags(flag_values)


def test_mode_flags_read_dense_variables_packed_by_default_with_async():
  mode = _mode
  assert mode().packed_reads is True
  assert mode("--nopacked_reads").packed_reads is False
  assert mode("--sync_mode=sync").packed_reads is False
  assert mode("--sync_mode=geo", "--nopacked_reads").describe(2) == "geo, 10 local steps per push"


def test_records_lock_flag_is_on_by_default_off_with_norecords_lock_and_refused_off_outside_async():
  assert _mode().records_lock is True and _mode("--sync_mode=geo").records_lock is True
  off = _mode("--norecords_lock")
  assert off.records_lock is False and off.describe(2) == "async, no records lock"  # the run's start line
  assert _mode("--norecords_lock", "--pipelined_updates").describe(2) == "async, updates pipelined, no records lock"
  with pytest.raises(UsageError, match=re.escape("`records_lock` (False) applies only to sync_mode=async, not sync")):
    _mode("--sync_mode=sync", "--norecords_lock")


def test_unrolled_steps_flag_takes_a_number_or_auto_and_refuses_anything_else_in_one_line():
  assert _mode().unrolled_steps == 1
  assert _mode("--unrolled_steps=4").unrolled_steps == 4
  assert _mode("--unrolled_steps=auto").unrolled_steps == "auto"
  for value, shown in (("0", "0"), ("-2", "'-2'"), ("four", "'four'")):
    with pytest.raises(UsageError, match=re.escape(f"`unrolled_steps` ({shown}) must be a positive integer")):
      _mode(f"--unrolled_steps={value}")


@pytest.mark.parametrize("args, message", [
    (["--geo_steps=5"], "`geo_steps` (5) applies only to sync_mode=geo, not async"),
    (["--sync_mode=sync", "--packed_reads"], "`packed_reads` (True) applies only to sync_mode=async, not sync"),
    (["--sync_mode=sync", "--bf16_rows"], "`bf16_rows` (True) applies only to sync_mode=async, not sync"),
])
def test_mode_flags_a_mode_does_not_take_are_refused_in_one_line(args, message):
  with pytest.raises(UsageError, match="^" + re.escape(message)):
    _mode(*args)


def test_define_flags_twice_is_harmless():
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flags_lib.define_flags(flag_values)
  assert "ps_hosts" in flag_values


def test_no_flags_and_no_tf_config_is_no_cluster():
  assert flags_lib.config_from_flags(parse(), environ={}) is None


def test_tf_config_is_honoured():
  config = flags_lib.config_from_flags(parse(), environ={"TF_CONFIG": TF_CONFIG})
  assert (config.task_type, config.task_index, config.num_workers) == ("worker", 1, 2)


def test_flags_agreeing_with_tf_config_are_fine():
  config = flags_lib.config_from_flags(parse("--job_name=worker", "--task_index=1",
                                             "--worker_hosts=127.0.0.1:2223,127.0.0.1:2224"),
                                       environ={"TF_CONFIG": TF_CONFIG})
  assert config.task_index == 1


@pytest.mark.parametrize("arg,message", [
    ("--job_name=ps", "--job_name=ps contradicts TF_CONFIG task.type=worker"),
    ("--task_index=0", "--task_index=0 contradicts TF_CONFIG task.index=1"),
    ("--ps_hosts=127.0.0.1:3000", "--ps_hosts=127.0.0.1:3000 contradicts TF_CONFIG cluster.ps=127.0.0.1:2222"),
    ("--worker_hosts=127.0.0.1:2223", "--worker_hosts=127.0.0.1:2223 contradicts TF_CONFIG "
     "cluster.worker=127.0.0.1:2223,127.0.0.1:2224"),
    ("--chief_hosts=127.0.0.1:2225", "--chief_hosts=127.0.0.1:2225 contradicts TF_CONFIG cluster.chief=(none)"),
    ("--evaluator_hosts=127.0.0.1:2226", "contradicts TF_CONFIG cluster.evaluator=(none)"),
])
def test_flags_contradicting_tf_config_name_both_values(arg, message):
  with pytest.raises(ClusterConfigError, match=None) as info:
    flags_lib.config_from_flags(parse(arg), environ={"TF_CONFIG": TF_CONFIG})
  assert message in str(info.value)


def test_job_name_required_with_host_flags():
  with pytest.raises(ClusterConfigError, match="--job_name is required"):
    flags_lib.config_from_flags(parse("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223"), environ={})


def test_negative_task_index_is_rejected_by_the_rules():
  with pytest.raises(ClusterConfigError, match="task_index -1 is out of range"):
    flags_lib.config_from_flags(parse("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223",
                                      "--job_name=worker", "--task_index=-1"), environ={})


def run_config_cli(*args, env=None):
  return subprocess.run([sys.executable, "-m", "tfps.cluster.config_cli", *args], capture_output=True, text=True,
                        env=env, cwd=REPO, timeout=60)


def test_tfps_config_prints_the_tf_config():
  result = run_config_cli("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223, 127.0.0.1:2224",
                          "--job_name=worker", "--task_index=1", env={"PATH": "/usr/bin"})
  assert result.returncode == 0, result.stderr
  assert json.loads(result.stdout) == json.loads(TF_CONFIG)


@pytest.mark.parametrize("args,message", [
    (["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:99999", "--job_name=worker"],
     "tfps-config: worker_hosts: port 99999 in '127.0.0.1:99999' is out of range; allowed 1-65535"),
    (["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=worker", "--task_index=x"],
     "tfps-config: flag --task_index=x: invalid literal for int()"),
    (["--ps_hostz=127.0.0.1:2222"], "tfps-config: Unknown command line flag 'ps_hostz'"),
    ([], "tfps-config: no cluster given and TF_CONFIG is unset"),
    (["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=boss"],
     "tfps-config: job_name 'boss' is not one of chief, worker, ps, evaluator"),
    (["--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=ps", "extra"],
     "tfps-config: unexpected argument 'extra'"),
])
def test_tfps_config_bad_input_is_one_line_and_exit_2(args, message):
  result = run_config_cli(*args, env={"PATH": "/usr/bin"})
  assert result.returncode == 2
  assert result.stdout == ""
  assert result.stderr.strip().startswith(message), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert "Traceback" not in result.stderr


def test_tfps_config_bad_tf_config_env():
  result = run_config_cli(env={"PATH": "/usr/bin", "TF_CONFIG": "{oops"})
  assert result.returncode == 2
  assert result.stderr.startswith("tfps-config: TF_CONFIG is not valid JSON")


@pytest.mark.parametrize("flag, message", [
    ("--bogus_flag=1", "train_keras.py: Unknown command line flag 'bogus_flag'"),
    ("--task_index=x", "train_keras.py: flag --task_index=x: invalid literal for int()"),
    ("--exact_evaluation true", "train_keras.py: unexpected argument 'true': this program takes flags only "
                                "(--name=value; a boolean flag is --name or --noname)"),
])
def test_a_training_script_given_a_bad_flag_ends_with_one_line_and_status_2(flag, message, subprocess_env):
  """Status 2 (`EXIT_REFUSED`), which tfps-launch does not restart; absl's own is two lines and status 1."""
  result = subprocess.run([sys.executable, str(REPO / "scripts" / "train_keras.py"), *flag.split()],
                          capture_output=True, text=True, env=subprocess_env, timeout=180, check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
  assert "Traceback" not in result.stderr and "Pass --helpshort" not in result.stderr


def test_moved_modules_keep_their_old_paths():
  """`tfps.flags`, `tfps.cluster.launch`, ... (moved to tfps/cli/) import the module of the new path, for one release."""
  import importlib  # pylint: disable=g-import-not-at-top
  from tfps import _aliases  # pylint: disable=g-import-not-at-top
  for old, new in _aliases.MOVED.items():
    assert importlib.import_module(old) is importlib.import_module(new), old
  from tfps import flags as old_flags  # pylint: disable=g-import-not-at-top
  assert old_flags.config_from_flags is flags_lib.config_from_flags and old_flags.__spec__.name == "tfps.cli.flags"
