"""The channel's errors, as a task and a client of the job see them.

Rules:
  1. A refusal by the coordination service is :class:`ChannelRejected`, with the service's
     reason (client rule 7); a service that cannot be reached, or does not answer in time,
     is :class:`ChannelUnavailable`.
  2. Both are named ``sparkcoord.channel.client.ChannelRejected`` and
     ``sparkcoord.channel.client.ChannelUnavailable``, their path before they had a module of
     their own, which exports them: a task's error line and a pickled error read the same as
     before (docs/decisions/100-channel-server-split.md).

Thread model: none (exception classes).
"""

from __future__ import annotations

from sparkcoord.core.errors import SparkCoordError

#: the module that exports these errors, and names them (rule 2)
EXPORTED_BY = "sparkcoord.channel.client"


class ChannelRejected(SparkCoordError):
    """The coordination service refused this task's registration, event or request (the job
    failed, the run ended, the attempt is stale). Raised without a traceback of the runtime
    or the operator (:func:`sparkcoord.channel.client.refused`): the reason is all there is
    to say."""


class ChannelUnavailable(SparkCoordError):
    """The coordination service could not be reached or did not answer in time."""


ChannelRejected.__module__ = ChannelUnavailable.__module__ = EXPORTED_BY
