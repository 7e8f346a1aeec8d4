"""存储故障日志的限流规则（runtime/outage_log.py）：首行立刻、之后每个间隔一行带计数的汇总、恢复一行。"""

from __future__ import annotations

import logging

import pytest

from chongming_task.runtime.outage_log import OutageLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "test.outage"]


def test_one_immediate_line_then_one_summary_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = OutageLog(logging.getLogger("test.outage"), interval=5.0, monotonic=clock)
    with caplog.at_level(logging.INFO, logger="test.outage"):
        # 40 个任务、每 0.05 秒一轮、持续 12 秒：旧实现是 9600 行
        for step in range(240):
            clock.now = 100.0 + step * 0.05
            for task in range(40):
                log.failure("save", f"t-{task}", "StoreError: 磁盘已满")
            log.tick()
        warnings = lines(caplog)
        assert len(warnings) == 3, warnings  # 首行 + 第 5、10 秒的两行汇总
        assert "t-0" in warnings[0] and "磁盘已满" in warnings[0]
        assert "写失败 " in warnings[1] and "40 个任务" in warnings[1] and "save×" in warnings[1]
        log.recovered()
    warnings = lines(caplog)
    assert len(warnings) == 4  # 恢复时补打未汇总的部分
    infos = lines(caplog, logging.INFO)
    assert len(infos) == 1 and "存储恢复" in infos[0] and "9600 次" in infos[0]


def test_tick_reports_a_stuck_outage_without_new_failures(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = OutageLog(logging.getLogger("test.outage"), interval=5.0, monotonic=clock)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        log.failure("create", "a", "x")
        log.failure("create", "b", "x")
        clock.now += 4.9
        log.tick()
        assert len(lines(caplog)) == 1
        clock.now += 0.2
        log.tick()
        assert len(lines(caplog)) == 2 and "写失败 1 次" in lines(caplog)[1]
        log.tick()
        assert len(lines(caplog)) == 2  # 没有新的失败就不再重复


def test_a_new_outage_after_a_quiet_interval_logs_immediately(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = OutageLog(logging.getLogger("test.outage"), interval=5.0, monotonic=clock)
    with caplog.at_level(logging.INFO, logger="test.outage"):
        log.failure("save", "a", "first")
        log.recovered()
        assert not log.in_outage
        clock.now += 1.0
        log.failure("save", "a", "second")
        warnings = lines(caplog)
        assert len(warnings) == 2 and "second" in warnings[1]
