"""A stand-in kubelet: the PodResourcesLister gRPC service (k8s.io/kubelet podresources v1, from the
same generated stubs the sampler uses) on a unix socket, answering ``List`` from pods a test sets."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from kernel_insight.agent.probe import podresources_pb2 as pb
from kernel_insight.agent.probe import podresources_pb2_grpc as pb_grpc


@dataclass
class Pod:
    name: str
    namespace: str
    #: container name -> {resource name: device ids}
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)


class _Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: StandInKubelet) -> None:
        self.kubelet = kubelet

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self.kubelet.calls += 1
        with self.kubelet.lock:
            pods = list(self.kubelet.pods)
        out = pb.ListPodResourcesResponse()
        for p in pods:
            pr = out.pod_resources.add(name=p.name, namespace=p.namespace)
            for cname, resources in p.containers.items():
                c = pr.containers.add(name=cname)
                for resource, ids in resources.items():
                    c.devices.add(resource_name=resource, device_ids=ids)
        return out


class StandInKubelet:
    """Serves PodResourcesLister on ``socket``; ``pods`` can change while it runs."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[Pod] = []
        self.lock = threading.Lock()
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{socket}")
        self._server.start()

    def set_pods(self, *pods: Pod) -> None:
        with self.lock:
            self.pods = list(pods)

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
