"""The old module paths of moved modules, kept for one release: importable (the same module object as the new path)
and runnable (`python -m tfps.cluster.launch` runs `tfps.cli.launch`). `tfps/__init__.py` installs them; no file is
left at an old path."""

import importlib
import importlib.abc
import importlib.util
import sys

# old module path -> where the module lives now
MOVED = {
    "tfps.flags": "tfps.cli.flags",
    "tfps.models.flags": "tfps.cli.model_flags",
    "tfps.cluster.launch": "tfps.cli.launch",
    "tfps.cluster.config_cli": "tfps.cli.config",
    "tfps.cluster.k8s_cli": "tfps.cli.k8s",
    "tfps.report.cli": "tfps.cli.report",
}


class _AliasLoader(importlib.abc.Loader):
  """Loads an old path as the module of its new path; `python -m` (runpy) gets the new module's code."""

  def __init__(self, target: str):
    self.target = target
    self._spec = None

  def create_module(self, spec):
    module = importlib.import_module(self.target)
    self._spec = module.__spec__
    return module

  def exec_module(self, module):
    module.__spec__ = self._spec  # importlib set the alias's spec on the module; it keeps its own

  def get_code(self, fullname):
    return importlib.util.find_spec(self.target).loader.get_code(self.target)

  def is_package(self, fullname):
    return False


class _AliasFinder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path=None, target=None):
    if fullname not in MOVED:
      return None
    origin = importlib.util.find_spec(MOVED[fullname]).origin
    return importlib.util.spec_from_loader(fullname, _AliasLoader(MOVED[fullname]), origin=origin)


def install() -> None:
  """Makes the old paths of `MOVED` resolve (after every file on `sys.path`); calling it again is harmless."""
  if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())
