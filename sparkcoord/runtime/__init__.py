"""Threads, time and storage around the sans-IO core: mailboxes, the coordination service,
checkpoint storage and restart strategies."""
