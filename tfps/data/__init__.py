"""Data readers (one for every delimited click log, driven by a feature spec) and the synthetic Criteo-schema generator.

Every reader returns a function `input_context -> tf.data.Dataset` of fixed-shape `(features, label)` batches, usable
as a ParameterServerStrategy per-worker dataset function; `tfps.data.pipeline` documents sharding, repeat and epochs.
Submodules: `spec` (feature specs: columns, label, transforms, delimiter, header, missing values; imports no
TensorFlow), `delimited` (the reader of any spec, malformed-row scan), `criteo` and `movielens` (their specs, plus
MovieLens's side tables), `synthetic` (generator; imports no TensorFlow), `schema` (Criteo columns).
"""
