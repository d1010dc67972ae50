"""Kubernetes attribution: which pod, namespace and container each GPU is assigned to.

Asks the kubelet's PodResources API (gRPC over a unix socket, ``List``, k8s.io/kubelet
podresources v1; stubs in ``podresources_pb2*.py`` generated from its api.proto) which
container holds each device of the GPU resources (``nvidia.com/gpu``, ``nvidia.com/mig-*``).
The NVIDIA device plugin names devices by GPU UUID, or by index with
``DEVICE_ID_STRATEGY=index``; both are matched.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import grpc

from kernel_insight.agent.probe import podresources_pb2, podresources_pb2_grpc

__all__ = [
    "DEFAULT_SOCKET",
    "UNASSIGNED",
    "Attribution",
    "KubeletUnavailable",
    "PodResources",
    "attribution_of",
]

#: Where the kubelet serves the PodResources API (a DaemonSet mounts the directory read-only).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Resource names whose devices are GPUs (the NVIDIA device plugin's; MIG strategies add nvidia.com/mig-*).
GPU_RESOURCE = "nvidia.com/gpu"
_MIG_PREFIX = "nvidia.com/mig-"
#: The kubelet caps each answer at 16 MiB (podresources' default); the client allows as much.
_MAX_MESSAGE = 16 << 20


class KubeletUnavailable(Exception):
    """The PodResources API did not answer (no socket, kubelet down, refused); the message says which."""


@dataclass(frozen=True, slots=True)
class Attribution:
    """The pod, namespace and container a GPU is assigned to; all "" when none is."""

    pod: str
    namespace: str
    container: str

    def labels(self) -> dict[str, str]:
        """The labels a GPU's series carry: none when no pod holds the GPU."""
        if not self.pod:
            return {}
        return {"pod": self.pod, "namespace": self.namespace, "container": self.container}


UNASSIGNED = Attribution("", "", "")


def _is_gpu(resource: str) -> bool:
    return resource == GPU_RESOURCE or resource.startswith(_MIG_PREFIX)


class PodResources:
    """A client of the kubelet's PodResources API.

    Example::

        with PodResources() as kubelet:
            owner = kubelet.gpus().get("GPU-0b1c2d3e-...", UNASSIGNED)
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE)],
        )
        self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._closed = False

    def gpus(self) -> dict[str, Attribution]:
        """Every GPU device id the kubelet has assigned, with its pod, namespace and container."""
        try:
            with self._lock:
                answer = self._stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            name = code.name if code is not None else "error"
            raise KubeletUnavailable(
                f"kubelet PodResources API at {self.socket_path}: {name}: {e.details() if hasattr(e, 'details') else e}"
            ) from None
        out: dict[str, Attribution] = {}
        for pod in answer.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not _is_gpu(devices.resource_name):
                        continue
                    for device in devices.device_ids:
                        out[device] = Attribution(pod.name, pod.namespace, container.name)
        return out

    def close(self) -> None:
        """Close the channel; safe twice."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def attribution_of(assigned: Mapping[str, Attribution], uuid: str, index: int) -> Attribution:
    """A GPU's attribution from the kubelet's device ids, named by UUID or (index strategy) by index."""
    return assigned.get(uuid) or assigned.get(str(index)) or UNASSIGNED
