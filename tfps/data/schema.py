"""The Criteo column schema, shared by the reader and the generator; imports no TensorFlow."""

from tfps import checks

LABEL = "label"
DENSE = "dense"
INTEGER_COLUMNS = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_COLUMNS = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = (LABEL,) + INTEGER_COLUMNS + CATEGORICAL_COLUMNS
FORMATS = {"csv": ",", "tsv": "\t"}


def check_format(file_format: str) -> str:
  """Returns `file_format` if it is "csv" or "tsv", else raises ValueError."""
  return checks.one_of("file_format", file_format, FORMATS)
