"""Recommender models on tensorflow-recommenders whose embedding tables the strategy shards over the ps.

Build one by name with `build_model(name, categorical, dense, **options)` under `strategy.scope()` (or without a
strategy), compile it with `compile_model`, and train it with Keras `fit` (`tfps.fit`), with its `step_loss(features,
labels, training)` in a loop of your own, or through `tfps.models.model_fns.build_model_fn` on the Estimator-style
path. `categorical` maps each categorical feature to its vocabulary size and `dense` each dense feature to its width:
the readers' `feature_spec` gives both. `embedding_tables(model)` lists the tables (sharded under the strategy);
`evaluate_top_k` measures a retrieval model against every candidate. Flags and flagfiles: `tfps.cli.model_flags`.

TensorFlow is imported on the first use of one of these names, not by `import tfps.models`: so `tfps.cli.model_flags`
(and a script's flag check by tfps-launch) starts without it.
"""

import importlib

_LAZY = {
    **{name: "tfps.models.builders" for name in ("MODELS", "OPTIMIZERS", "build_dcn", "build_model", "build_retrieval",
                                                 "build_wide_deep", "compile_model", "embedding_tables")},
    **{name: "tfps.models.ranking" for name in ("DCN", "RankingModel", "WideDeep")},
    **{name: "tfps.models.retrieval" for name in ("TwoTowerRetrieval", "evaluate_top_k")},
    "DynamicTables": "tfps.models.layers",
}
__all__ = sorted(name for name in _LAZY if name != "DynamicTables")


def __getattr__(name: str):
  """A public name (imported with its module) or a submodule (`tfps.models.ranking`), on first use."""
  if name in _LAZY:
    value = getattr(importlib.import_module(_LAZY[name]), name)
  elif not name.startswith("_"):
    try:
      value = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
      raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
  else:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  globals()[name] = value
  return value
