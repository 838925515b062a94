"""Closed vocabularies the report uses, shared by the code that writes them (ingest, stages) and
the code that reads them (renderers, gate, tests): profile sources, critical-path segment kinds
and critical-path edge kinds.

Each is a ``str`` enum (the project supports Python 3.10, which lacks ``enum.StrEnum``): a member
equals its value, formats as its value, and the JSON report holds the plain value.
"""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    """A str enum whose ``str()`` / ``format()`` is the value (as ``enum.StrEnum`` on 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Source(_StrEnum):
    """Where a rank's data was exported from (``ranks.source``, ``profile.sources``)."""

    ASCEND_PT = "ascend_pt"  # torch_npu profiler (PyTorch on Ascend)
    ASCEND_MS = "ascend_ms"  # MindSpore profiler (Ascend)
    KINETO = "kineto"  # PyTorch profiler (Kineto) Chrome trace

    @property
    def family(self) -> str:
        """The exporter family shown to users: ``Ascend`` or ``Kineto``."""
        return "Kineto" if self is Source.KINETO else "Ascend"


class SegmentKind(_StrEnum):
    """What a critical-path segment or operator is (``critical_path.segments[].kind``,
    ``by_kind_us`` keys), in the order charts draw them."""

    COMPUTE = "compute"
    COMMUNICATION = "communication"
    HOST = "host"
    IO = "io"
    OTHER = "other"
    IDLE = "idle"


class EdgeKind(_StrEnum):
    """A dependency the critical-path walk followed (``critical_path.edges`` keys)."""

    HOST_ORDER = "host order"  # the previous operator of the same host thread
    LAUNCH = "launch"  # a device operator to the host call that launched it
    STREAM_ORDER = "stream order"  # the previous operator of the same device stream
    RECORDED_EVENT_WAIT = "recorded event wait"  # a cross-stream wait the trace records
    COMMUNICATION_COMPLETION = "communication completion"  # inferred from timing: a collective's end
    COMPUTATION_COMPLETION = "computation completion"  # inferred from timing: a kernel's end
    UNKNOWN_LAUNCH = "unknown launch (to the main thread)"  # no launch link: back to the main thread
    THREAD_HAND_OFF = "thread hand-off"  # a host thread waiting for another one
    DEVICE_ORDER = "device order (no launch links)"  # device work ordered by time (no correlation ids)
    SYNC_WAIT = "sync wait"  # a host synchronisation waiting for the device
    LAUNCH_BEFORE_WINDOW = "launch before the window"  # device work queued before the window began

    @property
    def inferred(self) -> bool:
        """The edge is inferred from timing (the trace records no wait for it)."""
        return self in INFERRED_EDGES


#: edges inferred from timing rather than read from the trace
INFERRED_EDGES = frozenset({EdgeKind.COMMUNICATION_COMPLETION, EdgeKind.COMPUTATION_COMPLETION})
