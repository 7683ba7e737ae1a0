"""Example coordinators and operators, importable by Spark's Python workers (the demo and the
Spark tests use them)."""
