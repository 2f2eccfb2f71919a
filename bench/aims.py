"""What the throughput benchmark aims at, in one place: bench/throughput.py's targets and the verdicts of the tables
bench/tables.py writes into docs/performance.md both read these."""

VS_TUTORIAL_PEER = 1.15  # tfps.fit and the Estimator path: examples/s >= this x the tutorial's peer (keras_pss_*)
CPU_VS_SINGLE = 1.6  # 1 ps + 1 worker, batch 256: CPU per example over all tasks <= this x one process's
VS_SINGLE = 0.6  # 1 ps + 1 worker, batch 256: examples/s >= this x one process's
PS_VS_FLOOR = 1.05  # the ps's CPU per step <= this x the ps's floor (bench/ps_floor_train.py) at the same shape
COORDINATOR_SHARE = 0.05  # the chief's share of a step: its CPU or its time inside `schedule`, below this
