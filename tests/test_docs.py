"""The README, docs/ and the results' notes hold up: links and their anchors resolve, named flags exist, the README
stays short, and its first model runs under the local launcher and reaches the AUC the README states."""

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
NOTES = sorted((REPO / "bench" / "results").rglob("NOTES.md"))  # what past results measured, beside them
FIRST_MODEL = REPO / "examples" / "first_model.py"
PROGRAM_DIRS = ("tfps", "scripts", "bench", "examples")  # where the programs a reader runs define their flags
ABSL_FLAGS = {"flagfile", "help", "helpfull", "helpshort", "helpxml", "undefok"}  # every absl program has these
README_MAX_LINES = 250
PERFORMANCE_MAX_LINES = 400  # a reader's page; the history is in bench/results/*/NOTES.md
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


def heading_anchors(path: pathlib.Path) -> set:
  """The anchors GitHub gives the headings of `path`: lowercased, punctuation dropped, spaces as hyphens, a repeated
  one numbered."""
  anchors = set()
  for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
    if re.match(r"#{1,6} ", line):
      anchor = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
      numbered, n = anchor, 0
      while numbered in anchors:
        n += 1
        numbered = f"{anchor}-{n}"
      anchors.add(numbered)
  return anchors


def anchored_links(path: pathlib.Path):
  """`(markdown file, anchor)` of each link of `path` to a heading, in the same file or another in the repository."""
  text = _FENCE.sub("", path.read_text(encoding="utf-8"))
  for target in _LINK.findall(text):
    file, _, anchor = target.partition("#")
    if anchor and not re.match(r"[a-z]+:", target) and (not file or file.endswith(".md")):
      yield (path.parent / file).resolve() if file else path, anchor


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


@pytest.mark.parametrize("path", [README] + DOCS + NOTES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file(path):
  missing = [target for target in relative_links(path) if not (path.parent / target).exists()]
  assert not missing, f"{path.relative_to(REPO)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("path", [README] + DOCS + NOTES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_to_a_heading_finds_it(path):
  missing = [f"{target.relative_to(REPO)}#{anchor}" for target, anchor in anchored_links(path)
             if not target.exists() or anchor not in heading_anchors(target)]
  assert not missing, f"{path.relative_to(REPO)} links to headings that do not exist: {missing}"


def test_the_anchor_check_knows_githubs_anchors_and_rejects_others(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("# The ps's floor: `x` written directly\n## Notes\n## Notes\n```\n# not a heading\n```\n"
                  "[a](#notes-1) [b](other.md#top) [c](#not-a-heading) [d](https://x.org/#y) [e](p.png#z)\n")
  assert heading_anchors(page) == {"the-pss-floor-x-written-directly", "notes", "notes-1"}
  assert [(target.name, anchor) for target, anchor in anchored_links(page)] == [
      ("page.md", "notes-1"), ("other.md", "top"), ("page.md", "not-a-heading")]


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


def test_performance_md_is_read_in_ten_minutes():
  lines = (REPO / "docs" / "performance.md").read_text(encoding="utf-8").count("\n")
  assert lines <= PERFORMANCE_MAX_LINES, f"docs/performance.md has {lines} lines; at most {PERFORMANCE_MAX_LINES}"


def test_readme_shows_the_first_model_file_as_it_is():
  source = FIRST_MODEL.read_text(encoding="utf-8")
  code = source[source.index('"""', 3) + 3:].strip()  # the file without its docstring
  assert code.startswith("import") and code in README.read_text(encoding="utf-8")


def test_the_examples_run_without_a_cluster_say_so_in_one_line(subprocess_env):
  """Run as `python examples/x.py` with no cluster anywhere: one line naming what to give, as every entry point."""
  env = {name: value for name, value in subprocess_env.items() if name not in ("TF_CONFIG", "TFPS_TASK_TYPE")}
  examples = [FIRST_MODEL, REPO / "examples" / "online.py"]
  runs = [subprocess.Popen([sys.executable, str(path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for path in examples]  # both at once: two imports of TF
  for path, run in zip(examples, runs):
    _, stderr = run.communicate(timeout=180)
    lines = [line for line in stderr.splitlines() if line.startswith(f"{path.name}: ")]
    assert run.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"{path.name}: no cluster given: pass cluster="), stderr[-3000:]


def test_the_code_cites_the_notes_its_figures_come_from():
  """A measured figure in a comment or docstring of tfps/ names the notes beside its results
  (bench/results/**/NOTES.md), which exist; docs/performance.md no longer holds those figures."""
  cited = set()
  for path in (REPO / "tfps").rglob("*.py"):
    text = path.read_text(encoding="utf-8")
    assert "docs/performance.md" not in text, f"{path.relative_to(REPO)} cites docs/performance.md for a figure"
    cited.update(re.findall(r"bench/results/[\w/]*NOTES\.md", text))
  assert len(cited) >= 5, cited  # the check sees the citations at all
  assert all((REPO / target).is_file() for target in cited), sorted(t for t in cited if not (REPO / t).is_file())


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
