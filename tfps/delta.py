"""Serving side of delta exports: `tfps.delta.apply(base, deltas, out)` gives a SavedModel that answers as a full
export at the last delta's step would; `tfps.delta.watch(folder, serving_dir)` keeps a served export current with a
folder of deltas (docs/delta_export.md). The same on the command line: `tfps-delta apply`, `tfps-delta watch`."""

from tfps.keras.delta_watch import watch  # pylint: disable=unused-import
from tfps.keras.deltas import apply  # pylint: disable=unused-import
from tfps.training.deltas import DeltaError  # pylint: disable=unused-import
