"""The cluster and launching layer: cluster description and TF_CONFIG, per-role servers and dispatch, the local launcher and its supervisor. Imports no TensorFlow except in `server` and `roles`."""
