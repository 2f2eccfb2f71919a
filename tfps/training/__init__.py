"""The training machinery under both paths: the strategy, variable creation, training modes (async with exactly-once accounting, sync, geo), the coordinator loop and checkpoints."""
