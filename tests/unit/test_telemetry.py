"""The metrics facade: each metric defined once, recorded to prometheus-client (this process's
``/metrics``) and, in a Ray process, to Ray's metrics export, where a gauge's label sets are
exactly those set now (re-sent each half report interval; a removed one is no longer sent)."""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_app import telemetry
from serve_app.routing import metrics as routing_metrics
from serve_app.serving import metrics as serving_metrics


def unique(stem: str) -> str:
    """A metric name no other test registered (prometheus-client's registry is global)."""
    return f"serve_app_test_{stem}_{uuid.uuid4().hex[:8]}"


class FakeRayMetric:
    """What the facade asks of a ``ray.serve.metrics`` metric, written down."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", value, dict(tags)))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("set", value, dict(tags)))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", value, dict(tags)))


@pytest.fixture
def in_ray(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeRayMetric]:
    """The facade as in a Ray process, each metric's Ray side a `FakeRayMetric` (by name); no
    pusher thread (the tests call `telemetry.push_gauges` themselves)."""
    fakes: dict[str, FakeRayMetric] = {}

    def make_ray(metric: telemetry.Metric) -> FakeRayMetric:
        return fakes.setdefault(metric.name, FakeRayMetric())

    monkeypatch.setattr(telemetry, "_ray_running", lambda: True)
    monkeypatch.setattr(telemetry.Metric, "_ray_metric", make_ray)
    monkeypatch.setattr(telemetry._Pusher, "ensure_running", classmethod(lambda cls: None))
    return fakes


def local_samples(name: str) -> dict[tuple, float]:
    """This process's samples of metric family ``name`` (as ``/metrics`` shows them)."""
    text = prometheus_client.generate_latest().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    }


def test_every_app_metric_shows_the_names_it_declares_on_metrics() -> None:
    """The names the dashboard's test reads from the facade are those a scrape shows."""
    defined = [
        value
        for module in (routing_metrics, serving_metrics)
        for value in vars(module).values()
        if isinstance(value, telemetry.Metric)
    ]
    assert len(defined) >= 20
    text = prometheus_client.generate_latest().decode()
    shown = {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
    for metric in defined:
        if not metric.label_names:  # labelled ones show only once a label set is recorded
            assert metric.exported_names(prefix="") <= shown, metric.name
        assert metric.exported_names() == {
            "ray_" + name for name in metric.exported_names(prefix="")
        }


def test_names_and_labels_ray_would_refuse_or_overwrite_are_refused() -> None:
    with pytest.raises(ValueError, match="no ':'"):
        telemetry.Counter("serve_app:requests", "old style")
    with pytest.raises(ValueError, match="prefix"):
        telemetry.Counter("ray_serve_app_requests", "prefixed twice")
    with pytest.raises(ValueError, match="Ray Serve's own tags"):
        telemetry.Gauge(unique("reserved"), "a replica label", ["replica"])
    with pytest.raises(ValueError, match="takes labels"):
        telemetry.Counter(unique("labels"), "one label", ["status"]).labels("a", "b")


def test_outside_ray_only_metrics_records_and_no_ray_metric_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Outside Ray whatever ran before in this process (a unit test may have started Ray).
    monkeypatch.setattr(telemetry, "_ray_running", lambda: False)
    counter = telemetry.Counter(unique("local"), "local only", ["status"])
    counter.labels("completed").inc(2)
    counter.labels("completed").inc(0)  # prometheus-client's no-op, kept
    assert counter._ray is None
    assert counter.labels("completed").value == 2
    samples = local_samples(counter.name)
    assert samples[(counter.name + "_total", (("status", "completed"),))] == 2


def test_in_ray_every_record_goes_to_ray_too(in_ray: dict[str, FakeRayMetric]) -> None:
    counter = telemetry.Counter(unique("counter"), "c", ["status"])
    gauge = telemetry.Gauge(unique("gauge"), "g")
    histogram = telemetry.Histogram(unique("histogram"), "h", buckets=(0.1, 1))
    counter.labels("completed").inc(3)
    counter.labels("completed").inc(0)  # Ray refuses 0: not sent
    gauge.inc()
    gauge.inc(4)
    gauge.dec(2)
    histogram.observe(0.5)
    assert in_ray[counter.name].calls == [("inc", 3, {"status": "completed"})]
    # A gauge is sent as its value, never as a change: Ray's gauges only set.
    assert in_ray[gauge.name].calls == [("set", 1, {}), ("set", 5, {}), ("set", 3, {})]
    assert in_ray[histogram.name].calls == [("observe", 0.5, {})]
    assert local_samples(gauge.name) == {(gauge.name, ()): 3}


def test_a_gauge_set_to_its_current_label_sets_drops_the_others_everywhere(
    in_ray: dict[str, FakeRayMetric],
) -> None:
    gauge = telemetry.Gauge(unique("per_replica"), "per replica", ["engine_replica"])
    gauge.set_all({("a",): 1, ("b",): 2})
    gauge.set_all({("a",): 5, ("c",): 1})  # b left, c came
    assert gauge.label_sets() == [("a",), ("c",)]
    assert local_samples(gauge.name) == {
        (gauge.name, (("engine_replica", "a"),)): 5,
        (gauge.name, (("engine_replica", "c"),)): 1,
    }
    # What Ray is sent each half report interval: the current label sets only, so b ages out.
    in_ray[gauge.name].calls.clear()
    telemetry.push_gauges()
    pushed = {(call[2]["engine_replica"], call[1]) for call in in_ray[gauge.name].calls}
    assert pushed == {("a", 5), ("c", 1)}


def test_every_app_gauge_with_a_replica_label_drops_replicas_that_left(
    in_ray: dict[str, FakeRayMetric],
) -> None:
    """The router's per-engine-replica gauges: a replica gone from its view is gone from them."""
    routing_metrics.record_loads({"r1": 2, "r2": 0})
    routing_metrics.record_reported_conversations(["r1", "r2"], {"r1": 7})
    routing_metrics.record_loads({"r2": 1})
    routing_metrics.record_reported_conversations(["r2"], {})
    for gauge in (routing_metrics.REPLICA_ONGOING, routing_metrics.REPLICA_CONVERSATIONS):
        assert gauge.label_sets() == [("r2",)], gauge.name
        in_ray[gauge.name].calls.clear()
    telemetry.push_gauges()
    for gauge in (routing_metrics.REPLICA_ONGOING, routing_metrics.REPLICA_CONVERSATIONS):
        assert {call[2]["engine_replica"] for call in in_ray[gauge.name].calls} == {"r2"}


def test_in_a_serve_replica_ray_tags_every_series_with_the_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Ray metric is ``ray.serve.metrics``', made in the replica: Serve adds the replica,
    its deployment and application as tags."""
    from ray.serve import context

    replica: Any = SimpleNamespace(
        deployment="EngineDeployment", replica_tag="abc123", app_name="serve_app"
    )
    monkeypatch.setattr(context, "_get_internal_replica_context", lambda: replica)
    gauge = telemetry.Gauge(unique("tagged"), "tagged", ["engine_replica"])
    ray_gauge = gauge._make_ray()
    assert set(ray_gauge._tag_keys) == {"deployment", "replica", "application", "engine_replica"}
    assert ray_gauge._default_tags == {
        "deployment": "EngineDeployment",
        "replica": "abc123",
        "application": "serve_app",
    }


def test_gauges_changed_from_several_threads_while_pushed_end_as_last_set(
    in_ray: dict[str, FakeRayMetric],
) -> None:
    """The router's loop, the replica's loop and the pusher thread touch the same gauges."""
    import random
    import threading

    gauge = telemetry.Gauge(unique("threads"), "threads", ["engine_replica"])
    errors: list[BaseException] = []
    stop = threading.Event()

    def change(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(2000):
                chosen = rng.sample(["a", "b", "c", "d"], rng.randint(0, 4))
                gauge.set_all({(replica,): rng.random() for replica in chosen})
        except BaseException as error:
            errors.append(error)

    def push() -> None:
        try:
            while not stop.is_set():
                telemetry.push_gauges()
        except BaseException as error:
            errors.append(error)

    pusher = threading.Thread(target=push)
    # Threads switch every microsecond, not every 5 ms: many more interleavings.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        pusher.start()
        changers = [threading.Thread(target=change, args=(seed,)) for seed in range(4)]
        for thread in changers:
            thread.start()
        for thread in changers:
            thread.join()
    finally:
        stop.set()
        pusher.join()
        sys.setswitchinterval(switch_interval)
    assert not errors, errors
    # /metrics shows exactly the label sets the gauge holds (and re-sends to Ray).
    shown = {labels for _name, labels in local_samples(gauge.name)}
    assert shown == {(("engine_replica", replica),) for (replica,) in gauge.label_sets()}
    gauge.set_all({("x",): 1})
    in_ray[gauge.name].calls.clear()
    telemetry.push_gauges()
    assert in_ray[gauge.name].calls == [("set", 1, {"engine_replica": "x"})]
    assert local_samples(gauge.name) == {(gauge.name, (("engine_replica", "x"),)): 1}


def test_a_label_set_set_again_while_it_is_removed_stays_on_metrics(
    in_ray: dict[str, FakeRayMetric], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one interleaving that matters, forced: another thread sets ``b`` again just as
    ``b`` is removed. /metrics must still show it afterwards, as the gauge (and Ray) does."""
    import threading

    gauge = telemetry.Gauge(unique("interleaved"), "interleaved", ["engine_replica"])
    gauge.set_all({("a",): 1, ("b",): 2})
    remove = gauge._local.remove

    def remove_while_b_is_set_again(*values: str) -> None:
        other = threading.Thread(target=lambda: gauge.labels("b").set(5))
        other.start()
        other.join(timeout=0.2)  # blocked by the facade's lock, if it holds one here
        remove(*values)
        monkeypatch.setattr(gauge._local, "remove", remove)
        threads.append(other)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(gauge._local, "remove", remove_while_b_is_set_again)
    gauge.set_all({("a",): 1})
    for thread in threads:
        thread.join()
    assert gauge.label_sets() == [("a",), ("b",)]
    assert local_samples(gauge.name) == {
        (gauge.name, (("engine_replica", "a"),)): 1,
        (gauge.name, (("engine_replica", "b"),)): 5,
    }
