"""触发源只在 ``chongming_task.core.triggers`` 里写一次（issue 15 的验收条件之一）。

扫描整个 monorepo 的 ``packages/*/src``：任何"长得像 trigger"的字符串字面量（``"来源:事件"``，来源是
清单里出现过的前缀，或 controller / timeout / watchdog / retry 这类一看就是触发源的词）只允许出现在
triggers.py 里。别处要用，就引用那里的常量——否则同一个名字会被写成两份，改一处漏一处。
"""

from __future__ import annotations

import pathlib
import re

from chongming_task.core import state_machine, triggers
from chongming_task.core.statuses import TRANSITIONS
from chongming_task.core.triggers import ALL_TRIGGERS, AUDITED_TRIGGERS, SOURCE_PREFIXES

REPO = pathlib.Path(__file__).resolve().parents[3]
TRIGGER_MODULE = REPO / "packages/chongming-task-core/src/chongming_task/core/triggers.py"
EXTRA_SOURCES = {"controller", "timeout", "watchdog", "retry", "lifecycle", "store", "supervisor"}


def _literal_pattern() -> re.Pattern[str]:
    sources = "|".join(sorted(SOURCE_PREFIXES | EXTRA_SOURCES))
    return re.compile(rf"""["']((?:{sources}):[a-z_]+)["']""")


def _offending_literals(paths: list[pathlib.Path]) -> list[str]:
    pattern = _literal_pattern()
    found = []
    for path in paths:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in pattern.finditer(line):
                found.append(f"{path}:{lineno}: {match.group(1)}")
    return found


def test_no_trigger_literal_outside_the_trigger_module() -> None:
    sources = sorted(REPO.glob("packages/*/src/**/*.py"))
    assert TRIGGER_MODULE in sources, "要扫描的源码树不完整：找不到 core/triggers.py"
    assert len(sources) > 50
    offending = _offending_literals([p for p in sources if p != TRIGGER_MODULE])
    hint = "trigger 字面量只能写在 core/triggers.py，请改用那里的常量：\n"
    assert offending == [], hint + "\n".join(offending)


def test_the_scan_catches_a_reintroduced_literal(tmp_path: pathlib.Path) -> None:
    # 守门的扫描本身要能咬人：一个重新写回的字面量（单引号或双引号都算）必须被认出来。
    probe = tmp_path / "probe.py"
    probe.write_text(
        "machine.mark_queued(trigger=\"runtime:retry_due\")\nx = 'control:pause'\nok = 'not a trigger'\n",
        encoding="utf-8",
    )
    assert [line.rsplit(" ", 1)[1] for line in _offending_literals([probe])] == [
        "runtime:retry_due",
        "control:pause",
    ]


def test_the_trigger_module_declares_each_literal_once() -> None:
    text = TRIGGER_MODULE.read_text(encoding="utf-8")
    literals = [m.group(1) for m in _literal_pattern().finditer(text)]
    assert len(literals) == len(set(literals)), "同一个触发源在 triggers.py 里写了两次：请让别名引用常量"
    assert set(literals) == set(ALL_TRIGGERS)
    declared = {getattr(triggers, name) for name in triggers.__all__ if name.startswith("TRIGGER_")}
    assert declared == set(ALL_TRIGGERS)


def test_audited_triggers_are_the_machine_s_escape_hatches() -> None:
    assert {triggers.TRIGGER_RETRY, triggers.TRIGGER_RESET, triggers.TRIGGER_FORCE} == AUDITED_TRIGGERS
    assert AUDITED_TRIGGERS <= ALL_TRIGGERS
    # 状态机查的就是这一个集合（同一个对象），而不是它自己的一份拷贝。
    assert state_machine.AUDITED_TRIGGERS is AUDITED_TRIGGERS
    assert all(re.fullmatch(r"[a-z]+:[a-z_]+", t) for t in ALL_TRIGGERS)
    assert len(TRANSITIONS) == 15
