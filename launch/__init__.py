"""Running many runs at once: local processes, or tasks on a Ray cluster (``launch.jobs``)."""
