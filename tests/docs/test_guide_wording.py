"""文档里几句容易过时的话（issue 16.14）：对照代码的真实行为，不许漂移。

* §9.6 节点桶归属的示例消息由可运行的代码块逐字断言（见 test_doc_snippets）；这里再确认那一句还在、
  而且桶号就是默认 64 个桶时代码算出来的那个；
* 开发阶段的临时注释（"log/progress 属于 P4，此处暂用 print"）不许留在面向用户的文档里；
* close() 对排队任务的说法：直接落 stopped，而不是"先启动再停止"。
"""

from __future__ import annotations

import re
from pathlib import Path

from chongming_task import BucketPolicy
from chongming_task.policies import DEFAULT_NUM_BUCKETS

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "user-guide.md"
USER_FACING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_bucket_example_message_matches_the_default_bucket_count() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    quoted = re.findall(r"桶 (\d+)（来自 bucket_key='([^']+)'）不属于本节点", text)
    assert quoted, "§9.6 应当给出提交被拒绝时的示例消息"
    assert DEFAULT_NUM_BUCKETS == 64
    for number, key in quoted:
        assert int(number) == BucketPolicy(DEFAULT_NUM_BUCKETS).bucket_for(key), (number, key)


def test_no_development_phase_notes_in_user_facing_docs() -> None:
    stale = re.compile(r"属于 ?P\d|此处暂用")
    offending = [
        f"{doc.name}:{number}: {line.strip()}"
        for doc in USER_FACING
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1)
        if stale.search(line)
    ]
    assert offending == [], offending


def test_close_is_documented_as_sending_queued_tasks_straight_to_stopped() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert "排队中的任务**直接**落 `stopped`（历史是 `queued → stopped`" in text
    for doc in USER_FACING:
        assert "启动后立刻" not in doc.read_text(encoding="utf-8"), doc.name
