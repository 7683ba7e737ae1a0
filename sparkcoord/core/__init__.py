"""The sans-IO core of sparkcoord.

Nothing in this package touches sockets, threads, clocks, files or pyspark (a test enforces it).
Each piece is a state machine: callers feed it facts that happened (past-tense method names) and
get back decisions or commands (imperative names) that the runtime layer carries out.
"""
