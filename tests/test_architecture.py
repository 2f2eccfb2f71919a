"""The import rules of docs/architecture.md, checked on the source (no TensorFlow imported; well under a second).

* no module imports a higher layer, and the two training paths (and data, models) do not import each other;
* private TensorFlow and tf-keras names are imported only in the shim, `tfps/_tf_private.py`, and so are
  `tf.__internal__` and private attributes of other objects (`x._name`, `getattr(x, "_name")`);
* no function in tfps/ is longer than 50 lines;
* only the command-line layer (`tfps/cli/`) defines or reads absl flags.
"""

import ast
import pathlib
from typing import Dict, List, Tuple

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfps"

# Layer of each module (longest prefix wins), lowest first. A module may import its own layer and lower ranks only.
LAYERS = {
    "tfps.errors": ("base", 0), "tfps.run_records": ("base", 0), "tfps.checks": ("base", 0), "tfps.formatting": ("base", 0), "tfps._env": ("base", 0),
    "tfps._tf_private": ("base", 0), "tfps._aliases": ("base", 0),
    "tfps.cluster": ("cluster", 1),
    "tfps.training": ("training", 2),
    "tfps.data": ("data", 3), "tfps.keras": ("keras", 3), "tfps.estimator": ("estimator", 3),
    "tfps.report": ("report", 3),  # a run's curves from its run records (`tfps-report` itself is tfps/cli/report.py)
    "tfps.models": ("models", 4),  # recommender models for both paths: `model_fns` builds Estimator model_fns
    "tfps.testing": ("testing", 4),
    # The command-line layer: reads absl flags and builds the settings the layers below take; the console scripts of
    # setup.cfg (tfps-launch, tfps-config, tfps-k8s, tfps-report, tfps-delta).
    "tfps.cli": ("cli", 5),
    "tfps": ("facade", 6),  # tfps/__init__.py: the public names, imported lazily
    "tfps.layers": ("facade", 6),  # public re-export of tfps.models.dynamic_embedding
    "tfps.delta": ("facade", 6),  # public re-export of the serving side of delta exports
}
SHIM = "tfps._tf_private"
PRIVATE_PREFIXES = ("tensorflow.python", "tf_keras.src", "keras.src", "tensorflow.core")
# Whether absl parsed a command line (never a flag's value): `tfps._env.command_line_parsed`.
FLAGS_PROBE = "tfps._env"


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def layer_of(name: str) -> Tuple[str, int]:
  matches = [prefix for prefix in LAYERS if name == prefix or name.startswith(prefix + ".")]
  return LAYERS[max(matches, key=len)]


def imports_of(tree: ast.AST, module: str) -> List[Tuple[int, str]]:
  """(line, imported module) of every import, at any depth; `from tfps.x import y` counts as `tfps.x.y` when y is
  a module, else `tfps.x`."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        base = ".".join(module.split(".")[:-node.level] + ([base] if base else []))
      for alias in node.names:
        candidate = f"{base}.{alias.name}"
        is_module = (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists() or \
            (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
        found.append((node.lineno, candidate if is_module else base))
  return found


def sources() -> Dict[str, Tuple[pathlib.Path, ast.AST, str]]:
  result = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    text = path.read_text(encoding="utf-8")
    result[module_name(path)] = (path, ast.parse(text), text)
  return result


SOURCES = sources()


def test_every_module_has_a_layer():
  assert {name: layer_of(name) for name in SOURCES}  # layer_of raises on a module outside every layer
  assert all(layer_of(name)[0] != "facade" for name in SOURCES if name not in ("tfps", "tfps.layers", "tfps.delta"))


def test_no_module_imports_a_higher_layer_or_another_path():
  broken = []
  for name, (path, tree, _) in SOURCES.items():
    if layer_of(name)[0] == "facade":
      continue
    layer, rank = layer_of(name)
    for line, imported in imports_of(tree, name):
      if imported != "tfps" and not imported.startswith("tfps."):
        continue
      other, other_rank = layer_of(imported)
      if other_rank > rank or (other_rank == rank and other != layer):
        broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({layer}) imports {imported} ({other})")
  assert not broken, "\n".join(broken)


def test_private_tensorflow_names_only_in_the_shim():
  broken = []
  for name, (path, tree, text) in SOURCES.items():
    if name == SHIM:
      continue
    broken += [f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
               for line, imported in imports_of(tree, name) if imported.startswith(PRIVATE_PREFIXES)]
    broken += [f"{path.relative_to(PACKAGE.parent)} names {prefix}" for prefix in PRIVATE_PREFIXES
               if f"{prefix}." in text or f'"{prefix}"' in text]
  assert not broken, "\n".join(broken)


def private_reads(tree: ast.AST, text: str) -> List[Tuple[int, str]]:
  """(line, what) of each use of a private name of an object that is not the module's own: `tf.__internal__`,
  `x._name` (but `self._name`, `cls._name`, `os._exit`), `getattr` / `hasattr` / `setattr` of a literal `"_name"`."""
  found = [(number, "tf.__internal__") for number, line in enumerate(text.splitlines(), 1) if "__internal__" in line]
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and
        not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "os"))):
      found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in
        ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and
        str(node.args[1].value).startswith("_") and not str(node.args[1].value).startswith("__")):
      found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
  return found


def test_private_attributes_and_tf_internal_only_in_the_shim():
  broken = [f"{path.relative_to(PACKAGE.parent)}:{line} reads {what}" for name, (path, tree, text) in SOURCES.items()
            if name != SHIM for line, what in private_reads(tree, text)]
  assert not broken, "\n".join(broken)


@pytest.mark.parametrize("source", ["tf.__internal__.distribute.ShardedVariable\n", "model._is_compiled\n",
                                    "getattr(optimizer, '_initial_accumulator_value', 0.0)\n"])
def test_the_private_read_rule_catches_each_kind(source):
  assert private_reads(ast.parse(source), source) and not private_reads(ast.parse("self._x\n"), "self._x\n")


MAX_FUNCTION_LINES = 50


def test_no_function_is_longer_than_50_lines():
  broken = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path, tree, _ in SOURCES.values() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
            node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
  assert not broken, "\n".join(broken)


def test_only_the_flags_layer_reads_flags():
  broken = []
  for name, (path, tree, text) in SOURCES.items():
    if layer_of(name)[0] == "cli":
      continue
    uses = [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "FLAGS" or isinstance(node, ast.Name) and
            node.id == "FLAGS"]
    defines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and
               node.attr.startswith("DEFINE")]
    if name == FLAGS_PROBE:
      assert text.count("FLAGS") == 1 and "flags.FLAGS.is_parsed()" in text, "tfps._env may only ask is_parsed()"
      continue
    broken += [f"{path.relative_to(PACKAGE.parent)}:{line} reads absl FLAGS" for line in uses]
    broken += [f"{path.relative_to(PACKAGE.parent)}:{line} defines a flag" for line in defines]
  assert not broken, "\n".join(broken)


@pytest.mark.parametrize("source,error", [
    ("from tfps.keras import fitting\n", "imports tfps.keras.fitting (keras)"),
    ("from tfps.cli import flags as flags_lib\n", "imports tfps.cli.flags (cli)"),
])
def test_the_import_rule_catches_an_upward_import(source, error):
  """The check itself: a training-layer module importing the Keras path or the flags layer is reported."""
  tree = ast.parse(source)
  imported = [name for _, name in imports_of(tree, "tfps.training.loop")]
  layer, rank = layer_of("tfps.training.loop")
  other, other_rank = layer_of(imported[0])
  assert other_rank > rank and f"imports {imported[0]} ({other})" == error
