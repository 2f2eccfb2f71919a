"""`tfps-report MODEL_DIR`: a PNG of a run's learning curves, throughput and restarts, from its run records."""
