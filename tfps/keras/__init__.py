"""The Keras path: `tfps.fit` (tf-keras `Model.fit` under ParameterServerStrategy), its callbacks, inline and sidecar evaluation, and the serving export."""
