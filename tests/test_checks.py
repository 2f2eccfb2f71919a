"""tfps.checks: each check returns the value it accepts and raises one line naming the argument, value and rule."""

import pytest

from tfps import checks
from tfps.errors import UsageError


@pytest.mark.parametrize("call,message", [
    (lambda: checks.positive_int("epochs", 0), "`epochs` (0) must be a positive integer"),
    (lambda: checks.positive_int("epochs", True), "`epochs` (True) must be a positive integer"),
    (lambda: checks.positive_int("epochs", 2.0), "`epochs` (2.0) must be a positive integer"),
    (lambda: checks.positive_int("steps", -1, allow_none=True), "`steps` (-1) must be a positive integer or None"),
    (lambda: checks.non_negative_int("seed", -1), "`seed` (-1) must be a non-negative integer"),
    (lambda: checks.non_negative_number("throttle_secs", -0.5, "number of seconds"),
     "`throttle_secs` (-0.5) must be a non-negative number of seconds"),
    (lambda: checks.non_negative_number("poll_secs", float("nan"), "number of seconds"),
     "`poll_secs` (nan) must be a non-negative number of seconds"),
    (lambda: checks.non_negative_number("poll_secs", float("inf"), "number of seconds"),
     "`poll_secs` (inf) must be a non-negative number of seconds"),
    (lambda: checks.int_in_range("shard_index", 3, 0, 2), "`shard_index` (3) must be an integer in 0-2"),
    (lambda: checks.one_of("sync_mode", "fast", ("async", "sync", "geo")),
     "`sync_mode` ('fast') must be one of async, sync, geo"),
    (lambda: checks.positive_ints("layer_sizes", (8, 0)), "`layer_sizes` ([8, 0]) must be positive integers"),
])
def test_bad_values_raise_one_line_usage_errors(call, message):
  with pytest.raises(UsageError) as info:
    call()
  assert str(info.value) == message
  assert isinstance(info.value, ValueError)  # callers catching ValueError keep working


def test_a_directory_is_made_or_refused_in_one_line(tmp_path):
  assert checks.directory("model_dir", str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
  assert (tmp_path / "a" / "b").is_dir()
  (tmp_path / "file").write_text("")
  with pytest.raises(UsageError, match=r"^`model_dir` \('.*/file'\) is a file, not a directory$"):
    checks.directory("model_dir", str(tmp_path / "file"))
  with pytest.raises(UsageError, match=r"^`model_dir` \('/proc/nope/run'\) cannot be made a directory: "):
    checks.directory("model_dir", "/proc/nope/run")


def test_good_values_come_back():
  assert checks.positive_int("epochs", 3) == 3
  assert checks.positive_int("steps", None, allow_none=True) is None
  assert checks.non_negative_int("seed", 0) == 0
  assert checks.non_negative_number("secs", 0.25) == 0.25
  assert checks.int_in_range("shard_index", 2, 0, 2) == 2
  assert checks.one_of("mode", "geo", ("async", "geo")) == "geo"
  assert checks.positive_ints("layer_sizes", (8, 4)) == [8, 4]
