"""The cluster layer: cluster description and TF_CONFIG, `StrategyOptions`, per-role servers and dispatch, the chief
reaching its tasks, the local launcher's processes and their supervisor (its command line: `tfps/cli/launch.py`).
Imports no TensorFlow except in `server` and `roles`."""
