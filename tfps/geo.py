"""Geo training mode (not implemented yet)."""

from tfps.errors import UsageError


def install(model, geo_steps, steps_per_epoch):
  del model, geo_steps, steps_per_epoch
  raise UsageError("sync_mode=geo is not available yet")
