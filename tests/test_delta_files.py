"""The files of delta exports without TensorFlow: what `tfps-delta watch` applies next, the versions it keeps, and
`tfps-delta`'s argument checks, made before TensorFlow is imported (exports here are manifests only)."""

import os
import subprocess
import sys

import pytest

from tfps.training import delta_files

MODEL, BASE_ID = "0123456789abcdef", "aaaaaaaaaaaa"


def export(folder, kind, version, previous=None, base=(0, BASE_ID), model=MODEL, step=None):
  """A manifest-only export `kind-version` in `folder` (a served version when `kind` is a number's folder)."""
  name = delta_files.name_of(kind, version) if kind in ("base", "delta") else kind
  path = os.path.join(folder, name)
  os.makedirs(path)
  manifest = {"format": delta_files.FORMAT, "kind": "delta" if kind == "delta" else "base", "version": version,
              "base": {"version": base[0], "id": base[1]}, "model": model, "step": 10 * version if step is None else step}
  if kind == "delta":
    manifest["previous"] = version - 1 if previous is None else previous
  delta_files.write_json(os.path.join(path, delta_files.MANIFEST if kind == "delta" else delta_files.BASE_MANIFEST),
                         manifest)
  return path


def names(todo):
  start, deltas, version = todo
  return os.path.basename(start), [os.path.basename(path) for path in deltas], version


def test_next_to_serve_starts_from_the_served_version_or_a_newer_base(tmp_path):
  folder, serving = str(tmp_path / "deltas"), str(tmp_path / "serving")
  export(folder, "base", 0)
  assert names(delta_files.next_to_serve(folder, None)) == ("base-000000", [], 0)
  for version in (1, 2):
    export(folder, "delta", version)
  assert names(delta_files.next_to_serve(folder, None)) == ("base-000000", ["delta-000001", "delta-000002"], 2)
  served = export(serving, "2", 2)
  assert delta_files.next_to_serve(folder, served) is None  # current
  export(folder, "delta", 3)
  assert names(delta_files.next_to_serve(folder, served)) == ("2", ["delta-000003"], 3)
  export(folder, "base", 4, base=(4, "bbbbbbbbbbbb"))  # a resumed run's base, and its delta
  export(folder, "delta", 5, base=(4, "bbbbbbbbbbbb"))
  assert names(delta_files.next_to_serve(folder, served)) == ("base-000004", ["delta-000005"], 5)
  os.makedirs(os.path.join(folder, ".tmp-delta-000006-0000abcd"))  # being written: not seen
  os.makedirs(os.path.join(folder, "delta-000006"))  # no manifest yet: not seen
  assert names(delta_files.next_to_serve(folder, served))[2] == 5


def test_next_to_serve_refuses_gaps_other_bases_and_models_in_one_line(tmp_path):
  folder, serving = str(tmp_path / "deltas"), str(tmp_path / "serving")
  export(folder, "base", 0)
  served = export(serving, "1", 1)
  export(folder, "delta", 3, previous=2)
  with pytest.raises(delta_files.DeltaError, match=r"^the delta chain has a gap: delta-000003 follows version 2, "
                     r"but the version before it here is 1; give every delta from 2 on$"):
    delta_files.next_to_serve(folder, served)
  export(folder, "delta", 2, base=(0, "cccccccccccc"))
  with pytest.raises(delta_files.DeltaError, match=r"^delta-000002 belongs to base-000000 \(id cccccccccccc\), "
                     r"not to base-000000 \(id aaaaaaaaaaaa\)$"):
    delta_files.next_to_serve(folder, served)
  other = str(tmp_path / "other")
  export(other, "base", 0)
  export(other, "delta", 1, model="fedcba9876543210")
  with pytest.raises(delta_files.DeltaError, match=r"^delta-000001 is from another model \(fingerprint "
                     r"fedcba9876543210, the base's 0123456789abcdef\)"):
    delta_files.next_to_serve(other, None)
  only_deltas = str(tmp_path / "only_deltas")
  export(only_deltas, "delta", 1)
  with pytest.raises(delta_files.DeltaError, match=r"holds deltas \(delta-000001, \.\.\.\) but no base export"):
    delta_files.next_to_serve(only_deltas, None)
  newer = export(str(tmp_path / "serving_newer"), "7", 7)
  with pytest.raises(delta_files.DeltaError, match=r"^the served version 7 is newer than every export in .* \(the "
                     r"newest: 1\); another run's folder\?$"):
    delta_files.next_to_serve(other, newer)


def test_prune_keeps_the_newest_versions(tmp_path):
  serving = str(tmp_path)
  for version in (3, 10, 7, 12):
    export(serving, str(version), version)
  os.makedirs(os.path.join(serving, "13.tmp-0000abcd"))  # not a version
  removed = delta_files.prune(serving, 2)
  assert sorted(os.path.basename(path) for path in removed) == ["3", "7"]
  assert sorted(os.listdir(serving)) == ["10", "12", "13.tmp-0000abcd"]
  assert sorted(delta_files.served_versions(serving)) == [10, 12]


CHECK_WITHOUT_TENSORFLOW = ("import sys; from tfps.cli import delta; status = delta.main(sys.argv); "
                            "print('tensorflow' in sys.modules, 'tf_keras' in sys.modules); sys.exit(status)")


@pytest.mark.parametrize("args,error", [
    (["apply", "{base}", "{first}", "{third}", "--out={tmp}/out"],
     "the delta chain has a gap: delta-000003 follows version 2, but the version before it here is 1; give every "
     "delta from 2 on"),
    (["apply", "{tmp}/missing", "--out={tmp}/out"], "'{tmp}/missing' is not a folder (an export is a folder with a "
     "manifest)"),
    (["apply", "{base}", "--out={base}"], "--out '{base}' exists already; give a new folder"),
    (["watch", "{tmp}/deltas", "--serving={tmp}/serving", "--keep=none"],
     "--keep='none' must be a positive integer; usage: tfps-delta watch FOLDER --serving=DIR [--keep=3] "
     "[--interval=1] [--once]"),
    (["watch", "{tmp}/deltas", "--serving={tmp}/serving", "--interval=nan"],
     "--interval='nan' must be a positive number; usage: tfps-delta watch FOLDER --serving=DIR [--keep=3] "
     "[--interval=1] [--once]"),
    (["watch", "{tmp}", "--serving={tmp}/serving", "--once"],
     "no export in '{tmp}' to serve (a run's exports are in its model_dir/deltas); usage: tfps-delta watch FOLDER "
     "--serving=DIR [--keep=3] [--interval=1] [--once]"),
], ids=["gap", "missing_base", "out_exists", "bad_keep", "nan_interval", "no_export"])
def test_command_line_checks_its_arguments_before_importing_tensorflow(tmp_path, subprocess_env, args, error):
  """A bad argument: one line on stderr, exit status 2, and TensorFlow never imported (no start-up noise)."""
  folder = str(tmp_path / "deltas")
  paths = {"base": export(folder, "base", 0), "first": export(folder, "delta", 1),
           "third": export(folder, "delta", 3, previous=2), "tmp": str(tmp_path)}
  args = [arg.format(**paths) for arg in args]
  env = dict(subprocess_env, TF_CPP_MIN_LOG_LEVEL="0")  # TensorFlow would say things
  checked = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TENSORFLOW] + args, capture_output=True, text=True,
                           env=env, timeout=60, check=False)
  assert (checked.returncode, checked.stdout, checked.stderr) == (2, "False False\n",
                                                                  f"tfps-delta: {error.format(**paths)}\n")
  console = subprocess.run([sys.executable, "-m", "tfps.cli.delta"] + args, capture_output=True, text=True, env=env,
                           timeout=60, check=False)
  assert (console.returncode, console.stderr) == (2, f"tfps-delta: {error.format(**paths)}\n")
  assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "serving")

