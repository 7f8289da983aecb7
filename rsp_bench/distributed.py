"""Suites spread over pytest-xdist workers and hosts: one run record, written by the controller.

How a distributed run works (``pytest suites/ -n 2 --dist loadgroup``, or ``--tx`` for hosts):

* **Groups.** Every test gets an ``xdist_group``: a test parametrized by ``rsp_config`` joins
  the group of its configuration, a test that already names a group keeps it (the static rows
  of the equivalence suite join the lossy configuration they are matched to), and any other test
  joins its module's group. The throughput suite is one group, because its interleaved benches
  need every configuration in one process. ``--dist loadgroup`` then keeps a configuration's
  tests on one worker, which loads the engine once with torch threads set to its share of the
  host's cores.
* **Records.** A worker writes no record and runs no gate: at its session end it hands its
  record to the controller through xdist's ``workeroutput``. The controller merges them
  (``merge_records``) into one record that says how many workers and hosts ran and which
  configuration ran where, writes it atomically, runs the gate once and prints one summary.
* **Crashes.** A worker that goes down with an error makes the merged record partial, naming the
  worker and the tests it was running; a partial record never becomes a baseline and fails the
  session.
* **Speed.** Timing figures taken while other workers decode on the same host are contended: the
  record says so (``extra.contended``) and the gate reports its timing metrics as "info", never
  gating them. Take speed baselines from a run with one worker per host.

Must NOT import torch, transformers or reference_engine (the controller never loads a model).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import pytest

from rsp_bench.baselines import metric_scope

__all__ = ["worker_id", "worker_count", "is_controller", "group_for", "assign_groups", "threads_for_worker",
           "merge_records", "DistributedRun"]

THROUGHPUT_GROUP = "throughput"


def worker_id(config: pytest.Config) -> str | None:
    """``gw0``, ``gw1``... in an xdist worker; None in a plain or controller process."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def worker_count(config: pytest.Config) -> int:
    """Workers of this run, as a worker sees it (1 outside a worker)."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput.get("workercount", 1)) if workerinput else 1


def is_controller(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller (it runs no tests, it merges records)."""
    # xdist's own pytest_configure (which registers its scheduler) may run after ours, so ask
    # the option it sets instead: "-n N" or "--tx" turn --dist from "no" into a mode.
    return (worker_id(config) is None and getattr(config.option, "dist", "no") not in (None, "no")
            and not getattr(config.option, "collectonly", False))


def group_for(item: pytest.Item) -> str:
    """The xdist group of ``item`` (see the module docstring for the rule)."""
    own = item.get_closest_marker("xdist_group")
    if own is not None:
        return str(own.args[0] if own.args else own.kwargs.get("name", "default"))
    if item.get_closest_marker("throughput") is not None:
        return THROUGHPUT_GROUP
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "rsp_config" in callspec.params:
        return str(callspec.params["rsp_config"])
    return item.nodeid.split("::")[0]


def assign_groups(items: Iterable[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_for(item)))


def threads_for_worker(config: pytest.Config, cores: int) -> int:
    """Torch threads for one worker: its share of the cores, assuming every worker of the run
    shares this host (xdist tells a worker the run's worker count, not its host's), so a
    worker never oversubscribes; a host that runs fewer workers only leaves cores idle."""
    return max(1, cores // max(1, worker_count(config)))


def merge_records(worker_records: list[tuple[str, Mapping[str, Any]]], builder: Any) -> dict[str, Any]:
    """Fold the workers' records into ``builder`` (a RunRecordBuilder); return what the merge saw:
    ``{"placement": {config: worker}, "hosts": [...], "conflicts": [...]}``.

    A metric two workers both measured (the reference row, say) must agree when it is a quality
    figure; a disagreement is kept as a conflict, not silently overwritten.
    """
    placement: dict[str, str] = {}
    hosts: list[str] = []
    conflicts: list[str] = []
    seen: dict[tuple[str, str], float] = {}
    for wid, record in sorted(worker_records, key=lambda wr: wr[0]):
        host = record["machine"]["hostname"]
        if host not in hosts:
            hosts.append(host)
        if record["model"]["name"] and not builder.record["model"]["name"]:
            builder.set_model(record["model"]["name"], record["model"]["path"], record["model"]["weights_sha256"])
        for suite in record["suites"]:
            builder.add_suite(suite)
        for key, value in record["extra"].items():
            if key not in builder.record["extra"]:
                builder.set_extra(key, value)
        for cid, conf in record["configurations"].items():
            placement.setdefault(cid, wid)
            for name, metric in conf["metrics"].items():
                if (cid, name) in seen:
                    if metric_scope(name) == "model" and abs(seen[(cid, name)] - metric["value"]) > 1e-12:
                        conflicts.append(f"{cid} {name}: {seen[(cid, name)]!r} vs {metric['value']!r} ({wid})")
                    continue
                seen[(cid, name)] = metric["value"]
                builder.add_metric(cid, name, metric["value"], metric["n"], ci=metric.get("ci"),
                                   unit=metric.get("unit", ""), samples=metric.get("samples"),
                                   engine=conf["engine"], mode=conf["mode"], sensitivity=conf["sensitivity"],
                                   params=conf["params"])
    return {"placement": placement, "hosts": hosts, "conflicts": conflicts}


class DistributedRun:
    """The controller's side of a distributed run, registered as a plugin by rsp_bench.plugin
    when xdist is active: collects each worker's record and crash, and where tests ran."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.crashed: list[str] = []
        self.running: dict[str, str] = {}  # worker -> the last test it started

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        wid = node.gateway.id
        out = getattr(node, "workeroutput", None) or {}
        record = out.get("rsp_record")
        if record is not None:
            self.records.append((wid, record))
        if error:
            where = self.running.get(wid, "no test")
            self.crashed.append(f"worker {wid} went down ({str(error).strip().splitlines()[-1][:200]}) "
                                f"while running {where}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        if node is not None and report.when == "setup":
            self.running[node.gateway.id] = report.nodeid
        if node is not None and report.failed and "crashed" in str(report.longrepr):
            self.crashed.append(f"worker {node.gateway.id} crashed while running {report.nodeid}")


def contended(workers: int, hosts: int) -> bool:
    """Whether timing figures were taken with other workers decoding on the same host."""
    return workers > max(1, hosts)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
