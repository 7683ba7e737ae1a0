"""Transport from subtasks (Spark tasks) to the coordination service: authenticated frames over
TCP. ``frames`` is sans-IO; ``server`` and ``client`` do the socket work."""
