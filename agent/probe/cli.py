"""``ki probe ebpf|nvml|simulate|cupti``: run a probe that writes into GPU rings.

Each probe is imported only when its command runs, so a machine without bcc
or NVML can still run the others (and ``ki --help``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_commands"]

Handler = Callable[[argparse.Namespace], int]


class ProbeUnavailable(Exception):
    """The probe cannot run on this machine (no BPF, no NVML...): one clear line, exit 2."""


def _simulate(args: argparse.Namespace) -> int:
    from kernel_insight.agent.probe.simulate import SimConfig, Simulator
    from kernel_insight.agent.ring import Ring, ring_name

    # SimConfig's own default unless given (imported here, not when the parser is built).
    oom = {} if args.oom_every is None else {"oom_every_s": args.oom_every}
    config = SimConfig(
        **oom,
        gpus=args.gpus,
        seed=args.seed,
        layers=args.layers,
        error_rate=args.error_rate,
        launch_sample=args.launch_sample,
        slow_kernel=args.slow_kernel,
        slow_factor=args.slow_factor,
        gpu_product=args.gpu_product,
        dcgm_names=args.dcgm_names,
        memory_total=int(args.memory_gib * (1 << 30)),
        static_memory=min(28 << 30, int(args.memory_gib * (1 << 30) * 0.35)),
    )
    if args.compress != 1:
        config = config.compressed(args.compress)
    rings = [Ring.attach(ring_name(f"{args.label_prefix}{i}"), create=True) for i in range(args.gpus)]
    try:
        sim = Simulator(config, rings)
        print(
            f"simulating {args.gpus} GPU(s) into {', '.join(r.name for r in rings)} "
            f"(every record flagged SIMULATED); Ctrl-C stops",
            file=sys.stderr,
        )
        slow_when = None
        if args.slow_kernel:
            flag = Path(args.slow_file) if args.slow_file else None
            slow_when = (lambda: True) if flag is None else flag.exists
        written = sim.run(args.seconds, slow_when=slow_when)
        dropped = sum(r.stats()["dropped"] for r in rings)
        print(f"wrote {written} records in {sim.steps} steps ({dropped} dropped: ring full)", file=sys.stderr)
    finally:
        for r in rings:
            r.close()
    return 0


def _nvml(args: argparse.Namespace) -> int:
    from kernel_insight.agent.probe.nvml import NvmlSampler, NvmlUnavailable

    try:
        sampler = NvmlSampler.open(
            gpus=_gpu_list(args.gpus),
            library=args.library,
            label_prefix=args.label_prefix,
            interval_s=args.interval,
            fingerprint_every_s=args.fingerprint_every,
            dcgm_names=args.dcgm_names,
            kubelet_socket=args.kubelet_socket,
            pods_every_s=args.pods_every,
        )
    except NvmlUnavailable as e:
        raise ProbeUnavailable(str(e)) from e
    with sampler:
        print(
            f"sampling NVML for GPU(s) {', '.join(map(str, sampler.indices))}; Ctrl-C stops", file=sys.stderr
        )
        sampler.run(args.seconds)
    return 0


def _ebpf(args: argparse.Namespace) -> int:
    from kernel_insight.agent.probe.ebpf import EbpfUnavailable, Tracer, TracerConfig

    config = TracerConfig(
        gpu=args.gpu,
        label_prefix=args.label_prefix,
        pid=args.pid,
        cgroup=args.cgroup,
        libcuda=args.libcuda,
        libcudart=args.libcudart,
        libnccl=args.libnccl,
        launch_sample=args.launch_sample,
        launch_latency=not args.count_only,
        launch_every=args.launch_every,
        drain_interval_s=args.interval,
    )
    try:
        tracer = Tracer.start(config)
    except EbpfUnavailable as e:
        raise ProbeUnavailable(str(e)) from e
    with tracer:
        print(f"tracing {tracer.describe()}; Ctrl-C stops", file=sys.stderr)
        try:
            tracer.run(args.seconds)
        finally:
            tracer.drain()
            print(tracer.summary(), file=sys.stderr)
    return 0


def _cupti(args: argparse.Namespace) -> int:
    import os

    from kernel_insight.agent.probe.cupti import CuptiUnavailable, cupti_environment

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("no command to run: ki probe cupti [--label-prefix P] -- CMD ARGS")
    try:
        env = cupti_environment(os.environ, label_prefix=args.label_prefix)
    except CuptiUnavailable as e:
        raise ProbeUnavailable(str(e)) from e
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        raise ValueError(f"cannot run {command[0]}: {e.strerror}") from e
    return 1  # not reached: execvpe replaces this process or raises


def _gpu_list(text: str) -> list[int] | None:
    if text == "all":
        return None
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gpus: expected 'all' or indices like 0,1,3, got {text!r}"
        ) from None
    if not gpus or min(gpus) < 0:
        raise argparse.ArgumentTypeError(f"--gpus: expected 'all' or indices like 0,1,3, got {text!r}")
    return gpus


def _above_zero(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number of ``unit`` > 0, worded as collector/flags.py's ``at_least``
    words its numbers (the agent component may not import the collector's). NaN passed a plain
    ``v <= 0`` test and reached the simulator; infinity made a wait past the platform's time_t."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if value > 1e9:  # infinity too
            raise argparse.ArgumentTypeError(f"expected a number of {unit} up to 1000000000, got {text!r}")
        if not value > 0:  # NaN: False
            raise argparse.ArgumentTypeError(f"expected a number of {unit} > 0, got {text!r}")
        return value

    return parse


def _bool(text: str) -> bool:
    """An argparse type for ``--flag=true|false``."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


_seconds = _above_zero("seconds")
_gib = _above_zero("GiB")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    probe = sub.add_parser(
        "probe", help="run a probe (eBPF tracer, NVML sampler, CUPTI, simulator) into GPU rings"
    )
    psub = probe.add_subparsers(dest="probe_command", required=True, metavar="PROBE")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--seconds", type=_seconds, default=None, help="stop after this long (default: run until Ctrl-C)"
        )
        p.add_argument(
            "--label-prefix",
            default="",
            help="ring of GPU i is /kernel_insight.<prefix><i> (default: no prefix)",
        )

    def dcgm(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dcgm-names",
            type=_bool,
            default=True,
            metavar="true|false",
            help="also write dcgm-exporter's series (DCGM_FI_*, its labels) beside ours (default true; "
            "docs/metrics.md)",
        )

    s = psub.add_parser(
        "simulate", help="write realistic records flagged SIMULATED, for machines without GPUs"
    )
    s.add_argument("--gpus", type=int, default=1, help="how many GPUs to simulate (default 1)")
    s.add_argument("--seed", type=int, default=0, help="random seed; equal seeds give equal runs")
    s.add_argument(
        "--gpu-product",
        default="NVIDIA H100 80GB HBM3",
        help="the GPU product name reported (the gpu_product label); the served model is an enrolment label",
    )
    s.add_argument(
        "--memory-gib", type=_gib, default=80.0, help="memory of each simulated GPU, GiB (default 80)"
    )
    s.add_argument("--layers", type=int, default=12, help="transformer layers per step (default 12)")
    s.add_argument("--error-rate", type=float, default=1 / 600, help="random errors per GPU per second")
    s.add_argument(
        "--oom-every",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="out-of-memory episodes, one per GPU this often on average (default: one an hour; inf: "
        "none), each a burst of failed allocations (docs/probes.md)",
    )
    s.add_argument(
        "--compress",
        type=_seconds,
        default=1.0,
        metavar="FACTOR",
        help="the rare events FACTOR times as often (FINGERPRINTs, errors, OOM episodes, checkpoint "
        "pauses), to see them all in minutes; kernels and samples keep their pace (default 1; docs/probes.md)",
    )
    s.add_argument("--launch-sample", type=int, default=16, help="one LAUNCH record per N launches (0: none)")
    s.add_argument(
        "--slow-kernel",
        default="",
        metavar="SUBSTRING",
        help="make the kernels whose name contains this slow (a regression to alert on)",
    )
    s.add_argument("--slow-factor", type=float, default=100.0, help="how many times slower (default 100)")
    s.add_argument(
        "--slow-file",
        default=None,
        metavar="PATH",
        help="slow only while this file exists (touch / rm it to switch; default: always)",
    )
    common(s)
    dcgm(s)
    s.set_defaults(handler=_errors_to_exit(_simulate))

    n = psub.add_parser("nvml", help="sample NVML once a second per GPU: memory, power, clocks, errors...")
    n.add_argument("--gpus", default="all", help="'all' (default) or indices such as 0,1")
    n.add_argument("--interval", type=_seconds, default=1.0, help="seconds between samples (default 1)")
    n.add_argument("--fingerprint-every", type=_seconds, default=60.0, help="seconds between FINGERPRINTs")
    n.add_argument(
        "--library", default=None, help="path of libnvidia-ml.so.1 (default: as the loader finds it)"
    )
    n.add_argument(
        "--kubelet-socket",
        default=None,
        metavar="PATH",
        help="ask the kubelet's PodResources API at this unix socket which pod holds each GPU "
        "(on Kubernetes: /var/lib/kubelet/pod-resources/kubelet.sock; default: not asked)",
    )
    n.add_argument(
        "--pods-every", type=_seconds, default=10.0, help="seconds between PodResources calls (default 10)"
    )
    common(n)
    dcgm(n)
    n.set_defaults(handler=_errors_to_exit(_nvml))

    e = psub.add_parser("ebpf", help="trace CUDA and NCCL calls with uprobes (root, bcc)")
    e.add_argument("--gpu", type=int, default=0, help="GPU whose ring receives the records (default 0)")
    who = e.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, default=None, help="trace only this process")
    who.add_argument("--cgroup", default=None, help="trace only processes of this cgroup v2 directory")
    who.add_argument("--all", action="store_true", help="trace every process (the default)")
    e.add_argument("--libcuda", default=None, help="path of libcuda.so.1 (default: as the loader finds it)")
    e.add_argument("--libcudart", default=None, help="path of libcudart.so (default: as the loader finds it)")
    e.add_argument("--libnccl", default=None, help="path of libnccl.so.2 (default: as the loader finds it)")
    e.add_argument("--launch-sample", type=int, default=0, help="one LAUNCH record per N launches (0: none)")
    e.add_argument(
        "--launch-every",
        type=int,
        default=0,
        metavar="N",
        help="trace kernel launches (a uprobe trap per cuLaunchKernel) during one drain interval in every N "
        "(0, the default: never; 1: always); timelines do not need them (docs/probes.md)",
    )
    e.add_argument(
        "--count-only",
        action="store_true",
        help="count launches without timing them (one uprobe per launch instead of two)",
    )
    e.add_argument("--interval", type=_seconds, default=1.0, help="seconds between map drains (default 1)")
    common(e)
    e.set_defaults(handler=_errors_to_exit(_ebpf))

    c = psub.add_parser(
        "cupti",
        help="run a command with the CUPTI activity probe: every kernel's device time (docs/probes.md)",
        description="Runs CMD with CUDA_INJECTION64_PATH naming the CUPTI probe, which writes each kernel, "
        "copy, memset and sync into its GPU's ring (/kernel_insight.<prefix><i>; the agent creates it).",
    )
    c.add_argument(
        "--label-prefix",
        default="",
        help="ring of GPU i is /kernel_insight.<prefix><i> (default: no prefix)",
    )
    c.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")
    c.set_defaults(handler=_errors_to_exit(_cupti))


def _errors_to_exit(fn: Handler) -> Handler:
    """A probe that cannot run says why in one line (exit 2); bad settings exit 1; no tracebacks."""

    def run(args: argparse.Namespace) -> int:
        from kernel_insight.agent.ring import RingError

        try:
            return fn(args)
        except ProbeUnavailable as e:
            print(f"ki probe {args.probe_command}: {e}", file=sys.stderr)
            return 2
        except (ValueError, RingError, argparse.ArgumentTypeError) as e:
            print(f"ki probe {args.probe_command}: {e}", file=sys.stderr)
            return 1

    return run
