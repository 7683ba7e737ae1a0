"""One connection of the channel server, as its I/O loop keeps it, and its writer.

Rules:
  1. A :class:`Connection` belongs to the server's I/O loop (server rule 2): only that thread
     reads its socket and changes its fields; admission (channel/admission.py) and the loop
     read them there.
  2. Everything written to a connection goes through its :class:`Writer`, one ``sendall`` at
     a time, so frames never interleave: the I/O loop writes the replies of a read, and the
     threads that complete an answer later (the coordinator's, the service closing) write
     that answer themselves (channel/dispatch.py).
  3. A writer that is ``closed`` writes nothing more: the connection ended, or a fault plan
     lost its answers (channel/faults.py). The loop closes a socket only under its writer's
     lock, so no answering thread writes to a descriptor that may be reused.

Thread model: as rule 1 for :class:`Connection`; :meth:`Writer.send` from any thread.
"""

from __future__ import annotations

import socket
import threading

from sparkcoord.channel.frames import FrameReader
from sparkcoord.core.ids import TaskAttempt


class Connection:
    """One admitted connection, as the I/O loop keeps it."""

    __slots__ = ("sock", "reader", "writer", "deadline", "peer", "authenticated", "attempt",
                 "finished")

    def __init__(self, sock: socket.socket, reader: FrameReader, writer: Writer,
                 deadline: float) -> None:
        self.sock, self.reader, self.writer, self.deadline = sock, reader, writer, deadline
        self.peer: object = "?"
        self.authenticated = False  # sent an authenticated frame: counted by the cap (server rule 6)
        self.attempt: TaskAttempt | None = None  # the task attempt it serves (its REGISTER)
        self.finished = False  # its last frame of note was FINISHED (the task's end, client rule 3)


class Writer:
    """Writes to one connection from its own thread and from the threads that answer its
    requests (one ``sendall`` at a time, so frames never interleave: rule 2)."""

    __slots__ = ("sock", "server", "lock", "closed")

    def __init__(self, sock: socket.socket, server: object) -> None:
        self.sock = sock
        self.server = server  # the ChannelServer it belongs to
        self.lock = threading.Lock()
        self.closed = False

    def send(self, data: bytes, quiet: bool = False) -> None:
        """Write ``data`` whole. The I/O loop (its replies), or an answering thread with
        ``quiet``: there a connection that went away is not an error (the task asks again on
        its next connection)."""
        if not data:
            return
        with self.lock:
            if self.closed:
                return
            try:
                self.sock.sendall(data)
            except OSError:
                if not quiet:
                    raise
                self.closed = True
