"""Layers that keep tables of their own on the ps (e.g. `tfps.layers.DynamicEmbedding`) meet the training paths here.

Such a layer has two methods, so the paths never need to know its class:
- `bind_optimizer(optimizer)`: called under the strategy scope once the model is built and compiled, before a step
  is traced (the layer resets the optimizer's slot rows of rows it gives out);
- `table_metrics()`: its statistics as `{name: number}`, read from the ps (logged as `<layer>/<name>`).
"""

from typing import Dict, List

import tf_keras


def tables_of(model: tf_keras.Model) -> List[tf_keras.layers.Layer]:
  """The model's layers that keep tables of their own."""
  return [layer for layer in model.submodules
          if callable(getattr(layer, "bind_optimizer", None)) and callable(getattr(layer, "table_metrics", None))]


def bind_optimizers(model: tf_keras.Model) -> None:
  for layer in tables_of(model):
    layer.bind_optimizer(model.optimizer)


def table_metrics(model: tf_keras.Model) -> Dict[str, float]:
  return {f"{layer.name}/{name}": value for layer in tables_of(model) for name, value in layer.table_metrics().items()}
