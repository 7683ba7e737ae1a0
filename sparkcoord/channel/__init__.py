"""Transport from subtasks (Spark tasks) to the coordination service: authenticated frames over
TCP. ``frames`` is the wire format; ``dispatch`` (the server's hand-off of decoded frames to
the service) and ``ledger`` (a task client's bookkeeping) are sans-IO; ``server`` (with
``admission`` and ``connection``), ``client`` and ``job_client`` do the socket work;
``faults`` holds the test fault plans (docs/layout.md, channel/)."""
