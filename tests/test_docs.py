"""The README and docs/ hold up: links resolve, named flags exist, the README stays short, and its first model runs
under the local launcher and reaches the AUC the README states."""

import ast
import os
import pathlib
import re
import subprocess
import sys

from fixtures.launcher import QUICK_STOP
import psutil
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
FIRST_MODEL = REPO / "examples" / "first_model.py"
PROGRAM_DIRS = ("tfps", "scripts", "bench", "examples")  # where the programs a reader runs define their flags
ABSL_FLAGS = {"flagfile", "help", "helpfull", "helpshort", "helpxml", "undefok"}  # every absl program has these
README_MAX_LINES = 250
STATED_VAL_AUC = 0.80  # the README: "requires `val_auc` of at least 0.80"

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FLAG_USE = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)")
_FLAG_DEFINITION = re.compile(r"DEFINE_\w+\(\s*(f?)\"([^\"]+)\"")


def relative_links(path: pathlib.Path):
  """Targets of the markdown links in `path` that point into the repository (code blocks hold no links)."""
  text = _FENCE.sub("", path.read_text(encoding="utf-8"))
  for target in _LINK.findall(text):
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      continue  # a web address or an anchor in the same file
    yield target.split("#")[0]


def defined_flags():
  """Names (or, for names built with an f-string, patterns) of every absl flag the programs define."""
  names, patterns = set(ABSL_FLAGS), []
  for directory in PROGRAM_DIRS:
    for path in (REPO / directory).rglob("*.py"):
      for is_fstring, name in _FLAG_DEFINITION.findall(path.read_text(encoding="utf-8")):
        if is_fstring:
          patterns.append(re.compile(re.sub(r"\\\{[^}]*\\\}", "[a-z]+", re.escape(name)) + "$"))
        else:
          names.add(name)
  return names, patterns


@pytest.mark.parametrize("path", [README] + DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file(path):
  missing = [target for target in relative_links(path) if not (path.parent / target).exists()]
  assert not missing, f"{path.relative_to(REPO)} links to files that do not exist: {missing}"


def test_the_link_check_sees_links_and_skips_code_blocks(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("[a](docs/a.md#part) ![b](b.png) [web](https://x.org) [here](#top)\n```\n[c](c.md)\n```\n")
  assert list(relative_links(page)) == ["docs/a.md", "b.png"]


def test_every_flag_the_readme_names_is_defined_by_a_program():
  names, patterns = defined_flags()
  used = set(_FLAG_USE.findall(README.read_text(encoding="utf-8")))
  assert {"ps_hosts", "job_name", "num_ps", "sync_mode"} <= used  # the README's own flags are found at all
  unknown = sorted(flag for flag in used
                   if flag not in names and flag.removeprefix("no") not in names
                   and not any(p.match(flag) for p in patterns))
  assert not unknown, f"README names flags no program defines: {['--' + flag for flag in unknown]}"


def test_the_flag_check_knows_flags_built_from_fstrings_and_rejects_made_up_ones():
  names, patterns = defined_flags()
  assert "max_restarts" in names and "flagfile" in names
  assert any(p.match("evaluator_hosts") for p in patterns)
  assert "fastest_mode" not in names and not any(p.match("fastest_mode") for p in patterns)


def test_readme_is_short():
  lines = README.read_text(encoding="utf-8").count("\n")
  assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}"


def test_readme_shows_the_first_model_file_as_it_is():
  source = FIRST_MODEL.read_text(encoding="utf-8")
  code = source[source.index('"""', 3) + 3:].strip()  # the file without its docstring
  assert code.startswith("import") and code in README.read_text(encoding="utf-8")


@pytest.mark.slow
def test_first_model_trains_under_the_local_launcher_to_the_stated_auc(tmp_path, subprocess_env):
  env = dict(subprocess_env, TMPDIR=str(tmp_path))  # the example keeps its data and model_dir in the temp folder
  try:
    run = subprocess.run([sys.executable, "-m", "tfps.cluster.launch", "--num_ps=1", "--num_workers=2", QUICK_STOP,
                          f"--log_dir={tmp_path / 'logs'}", str(FIRST_MODEL)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=480)
  finally:
    left = [p for p in psutil.process_iter() if _environ(p).get("TMPDIR") == str(tmp_path)]
    for process in left:
      process.kill()
  assert run.returncode == 0, run.stderr[-3000:]
  assert not left, f"processes left behind: {left}"
  final = [line for line in run.stdout.splitlines() if line.startswith("final: ")]
  assert final, run.stdout[-3000:]
  metrics = ast.literal_eval(final[-1].removeprefix("final: "))
  assert metrics["val_auc"] >= STATED_VAL_AUC, metrics
  checkpoints = tmp_path / "tfps_first_model" / "model" / "checkpoints"
  assert (checkpoints / "FINAL").is_file() and list(checkpoints.glob("ckpt-3.index"))


def _environ(process):
  try:
    return process.environ()
  except (psutil.Error, OSError):
    return {}
