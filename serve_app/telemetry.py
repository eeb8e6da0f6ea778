"""serve_app's metrics, each defined once, recorded to two places.

- **Ray's metrics export** (the service's view): in a Ray process every metric is also a
  ``ray.serve.metrics`` metric, which Ray Serve tags with the replica, its deployment and its
  application, and which each node's metrics agent exports on the node's metrics port
  (``ray.nodes()``' ``MetricsExportPort``) with Ray's ``ray_`` prefix: ``serve_app_requests`` is
  ``ray_serve_app_requests_total`` there. One scrape per node sees every replica on it; this is
  what Prometheus reads in the cluster (k8s/README.md).
- **prometheus-client** (this process's view): the default registry, which an ingress replica
  serves on its own ``/metrics`` and which the Ray-free local app and the unit tests read.

Names use ``_`` (Ray refuses ``:``). Gauges keep their current values here and re-send them to
Ray every half report interval: Ray drops a gauge value that is not re-sent within two (its
workers send a gauge's values once per interval and its agent keeps them two intervals), so a
label set `Gauge.remove` drops, or a process that is gone, leaves the export within about
``2 x RAY_metrics_report_interval_ms``. Counters and histograms are cumulative in Ray's agent: a
gone replica's series stays at its last value (its rate is 0) until the node's agent restarts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import prometheus_client

# Ray Serve adds these tags to every metric recorded in a replica; a label may not reuse them.
RESERVED_LABELS = frozenset({"deployment", "replica", "application", "route"})
RAY_PREFIX = "ray_"
_MIN_PUSH_PERIOD_S = 0.5


def _ray_running() -> bool:
    """Whether this process is a Ray worker or driver connected to a cluster. Without Ray ever
    imported it is not, and nothing imports Ray for it (the local app, the unit tests)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


class Metric:
    """One metric, with its label names; ``labels(...)`` gives the series of one label set."""

    kind: ClassVar[str]
    # The sample names a scrape shows, after the metric's name.
    suffixes: ClassVar[tuple[str, ...]]

    def __init__(self, name: str, description: str, labels: Sequence[str] = ()) -> None:
        if ":" in name or name.startswith(RAY_PREFIX):
            raise ValueError(f"{name}: no ':' and no {RAY_PREFIX!r} prefix (Ray adds it)")
        if reserved := RESERVED_LABELS.intersection(labels):
            raise ValueError(f"{name}: labels {sorted(reserved)} are Ray Serve's own tags")
        self.name = name
        self.description = description
        self.label_names = tuple(labels)
        self._local = self._make_local()
        self._ray: Any = None
        self._series: dict[tuple[str, ...], Series] = {}
        self._lock = threading.Lock()
        REGISTRY.append(self)

    def _make_local(self) -> Any:
        raise NotImplementedError

    def _make_ray(self) -> Any:
        raise NotImplementedError

    def exported_names(self, prefix: str = RAY_PREFIX) -> set[str]:
        """The sample names this metric shows on Ray's export (or on ``/metrics`` with
        ``prefix=""``)."""
        return {prefix + self.name + suffix for suffix in self.suffixes}

    def labels(self, *values: str) -> Series:
        """The series of one label set (made once, then looked up)."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.label_names):
                raise ValueError(f"{self.name} takes labels {self.label_names}, got {values}")
            with self._lock:
                series = self._series.setdefault(values, Series(self, values))
        return series

    def remove(self, *values: str) -> None:
        """Forget one label set: gone from ``/metrics`` now, from Ray's export once unsent."""
        # Under the lock `labels` takes: a label set set again meanwhile keeps its /metrics child.
        with self._lock:
            if self._series.pop(values, None) is not None:
                self._local.remove(*values)

    def label_sets(self) -> list[tuple[str, ...]]:
        with self._lock:
            return list(self._series)

    def _ray_metric(self) -> Any:
        """The Ray metric, made on the first record in a Ray process; None elsewhere."""
        if self._ray is None and _ray_running():
            with self._lock:
                if self._ray is None:
                    self._ray = self._make_ray()
        return self._ray

    # The series without labels.
    def inc(self, amount: float = 1) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self.labels().dec(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float) -> None:
        self.labels().observe(value)


class Series:
    """One label set of a metric: records to prometheus-client and, in Ray, to Ray."""

    __slots__ = ("_local", "_metric", "_tags", "value")

    def __init__(self, metric: Metric, values: tuple[str, ...]) -> None:
        self._metric = metric
        self._local = metric._local.labels(*values) if values else metric._local
        self._tags = dict(zip(metric.label_names, values, strict=True))
        self.value = 0.0  # a counter's total or a gauge's value, in this process

    def inc(self, amount: float = 1) -> None:
        self._local.inc(amount)
        if isinstance(self._metric, Gauge):
            self._set_value(self.value + amount)
            return
        self.value += amount
        # Ray refuses a counter increment of 0 (prometheus-client took it as a no-op).
        if amount > 0 and (ray_metric := self._metric._ray_metric()) is not None:
            ray_metric.inc(amount, tags=self._tags)

    def dec(self, amount: float = 1) -> None:
        self._local.dec(amount)
        self._set_value(self.value - amount)

    def set(self, value: float) -> None:
        self._local.set(value)
        self._set_value(value)

    def _set_value(self, value: float) -> None:
        self.value = value
        if (ray_metric := self._metric._ray_metric()) is not None:
            ray_metric.set(value, tags=self._tags)
            _Pusher.ensure_running()

    def observe(self, value: float) -> None:
        self._local.observe(value)
        if (ray_metric := self._metric._ray_metric()) is not None:
            ray_metric.observe(value, tags=self._tags)

    def push(self) -> None:
        """Re-send a gauge's value to Ray (`_Pusher`)."""
        if (ray_metric := self._metric._ray_metric()) is not None:
            ray_metric.set(self.value, tags=self._tags)


class Counter(Metric):
    kind = "counter"
    suffixes = ("_total",)

    def _make_local(self) -> Any:
        return prometheus_client.Counter(self.name, self.description, self.label_names)

    def _make_ray(self) -> Any:
        from ray.serve import metrics as ray_metrics

        return ray_metrics.Counter(self.name, self.description, self.label_names or None)


class Gauge(Metric):
    kind = "gauge"
    suffixes = ("",)

    def _make_local(self) -> Any:
        return prometheus_client.Gauge(self.name, self.description, self.label_names)

    def _make_ray(self) -> Any:
        from ray.serve import metrics as ray_metrics

        return ray_metrics.Gauge(self.name, self.description, self.label_names or None)

    def set_all(self, values: dict[tuple[str, ...], float]) -> None:
        """Exactly these label sets, with these values: every other one is removed (a replica
        that is gone is not shown with its last value)."""
        for label_set, value in values.items():
            self.labels(*label_set).set(value)
        for label_set in set(self.label_sets()) - values.keys():
            self.remove(*label_set)


class Histogram(Metric):
    kind = "histogram"
    suffixes = ("_bucket", "_sum", "_count")

    def __init__(
        self, name: str, description: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> None:
        self.buckets = tuple(buckets)
        super().__init__(name, description, labels)

    def _make_local(self) -> Any:
        return prometheus_client.Histogram(
            self.name, self.description, self.label_names, buckets=self.buckets
        )

    def _make_ray(self) -> Any:
        from ray.serve import metrics as ray_metrics

        return ray_metrics.Histogram(
            self.name, self.description, list(self.buckets), self.label_names or None
        )


# Every metric defined, in order (the dashboard's test reads the exported names from here).
REGISTRY: list[Metric] = []


def exported_names(metrics: Iterable[Metric] | None = None, prefix: str = RAY_PREFIX) -> set[str]:
    """Every sample name the metrics show on Ray's export (``prefix=""``: on ``/metrics``)."""
    return {
        name
        for metric in (REGISTRY if metrics is None else metrics)
        for name in metric.exported_names(prefix)
    }


class _Pusher:
    """A daemon thread that re-sends every gauge's values to Ray each half report interval,
    so a live series never ages out of the export and a removed one does."""

    _thread: ClassVar[threading.Thread | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def ensure_running(cls) -> None:
        if cls._thread is not None:
            return
        with cls._lock:
            if cls._thread is None:
                cls._thread = threading.Thread(
                    target=cls._run, name="serve_app-metrics-pusher", daemon=True
                )
                cls._thread.start()

    @staticmethod
    def period_s() -> float:
        import ray

        return max(ray._config.metrics_report_interval_ms() / 2000, _MIN_PUSH_PERIOD_S)

    @classmethod
    def _run(cls) -> None:
        period_s = cls.period_s()
        while True:
            time.sleep(period_s)
            push_gauges()


def push_gauges() -> None:
    """Re-send the current value of every gauge's every label set to Ray."""
    for metric in list(REGISTRY):
        if isinstance(metric, Gauge):
            with metric._lock:
                series = list(metric._series.values())
            for one in series:
                one.push()
