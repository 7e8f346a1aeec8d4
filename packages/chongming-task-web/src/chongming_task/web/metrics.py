"""``/metrics``：从存储读出的集群级指标（Prometheus 文本格式），只在装了 prometheus-client 时提供。

指标在每次抓取时现读（一次 stats + 一次 bucket_counts + 一次 list_nodes），用自己的 CollectorRegistry，
不混进进程级的默认指标。
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chongming_task.web.poller import SharedPoller
    from chongming_task.web.service import ConsoleService


def available() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


def render(service: ConsoleService, poller: SharedPoller) -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class StoreCollector:
        def collect(self) -> Iterator[Any]:
            overview = service.overview()
            tasks = GaugeMetricFamily("chongming_tasks", "存储里各状态的任务数", labels=["status"])
            for item in overview["statuses"]:
                tasks.add_metric([item["status"]], item["count"])
            yield tasks
            buckets = GaugeMetricFamily("chongming_bucket_tasks", "各桶的任务数", labels=["bucket"])
            for item in overview["buckets"]:
                buckets.add_metric([str(item["bucket"])], item["count"])
            yield buckets
            nodes = GaugeMetricFamily("chongming_nodes", "登记的节点数", labels=["alive"])
            alive = sum(1 for n in overview["nodes"] if n["alive"])
            nodes.add_metric(["true"], alive)
            nodes.add_metric(["false"], len(overview["nodes"]) - alive)
            yield nodes
            streams = GaugeMetricFamily("chongming_web_sse_subscribers", "本控制台当前的 SSE 订阅数")
            streams.add_metric([], sum(poller.subscribers().values()))
            yield streams

    registry = CollectorRegistry()
    registry.register(StoreCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["available", "render"]
