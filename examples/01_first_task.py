"""01 第一个任务：写一个任务、用 run_task 一行跑完、用 TaskRun 看清它走过的每一步。

演示并断言：
* 任务的第一个参数 ctx 由执行器注入，调用时不要自己传；
* run_task 阻塞到终态，返回 Outcome（ok / status / value / failure / snapshot）；
* 每次状态变化都留下一条 Transition（从哪到哪、触发源、版本号），版本号从 1 起逐一递增；
* 任务抛异常 → failed，failure 里带异常类型、消息与 traceback；
* 返回值必须可 JSON 序列化，否则失败类型是 result_invalid。

运行：python examples/01_first_task.py
"""

from __future__ import annotations

from typing import Any

from chongming_task import FailureKind, TaskContext, TaskStatus, task
from chongming_task.run import TaskRun, run_task


@task(tags={"demo"})
def count_words(ctx: TaskContext, text: str, *, min_length: int = 1) -> dict[str, Any]:
    """统计文本里的单词数。"""
    words = []
    for word in text.split():
        ctx.checkpoint()  # 每轮一次：让停止与暂停有机会生效
        if len(word) >= min_length:
            words.append(word)
    ctx.progress(len(words), unit="词")
    return {"words": len(words), "longest": max(words, key=len) if words else None}


def broken(ctx: TaskContext) -> None:
    raise RuntimeError("上游接口返回 500")


def returns_a_set(ctx: TaskContext) -> set[int]:
    return {1, 2, 3}  # set 不能 JSON 序列化


def main() -> None:
    # 1) 一行版：阻塞到终态
    outcome = run_task(count_words, "the quick brown fox jumps", min_length=4, task_id="job-1")
    print("run_task:", outcome.status.value, outcome.value)
    assert outcome.ok and outcome.status is TaskStatus.SUCCEEDED
    assert outcome.value == {"words": 3, "longest": "quick"}
    assert outcome.failure is None
    snap = outcome.snapshot
    assert snap.task_id == "job-1" and snap.name == "count_words"
    assert snap.description == "统计文本里的单词数。"  # @task 默认取 docstring 第一行
    assert "demo" in snap.tags and snap.attempt == 1 and snap.max_attempts == 1
    assert snap.progress is not None and snap.progress.describe() == "3 词"

    # 2) 完整版：TaskRun，可以中途干预，也能看到完整轨迹
    run = TaskRun(count_words, ("a bb ccc",), task_id="job-2", name="数词")
    run.start()  # 立即返回
    outcome = run.wait(timeout=10)
    assert outcome.value == {"words": 3, "longest": "ccc"}
    for record in run.transitions:
        print(f"  v{record.version}: {record.from_status} -> {record.to_status}  ({record.trigger})")
    path = [(t.from_status.value, t.to_status.value) for t in run.transitions]
    assert path == [
        ("pending", "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "succeeded"),
    ]
    assert [t.version for t in run.transitions] == [1, 2, 3, 4]
    assert run.snapshot.status_version == 4

    # 3) 抛异常 → failed，原因是技术细节（failure），不是状态
    outcome = run_task(broken)
    assert outcome.status is TaskStatus.FAILED and not outcome.ok and outcome.value is None
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.EXCEPTION
    assert outcome.failure.exc_type == "RuntimeError"
    assert outcome.failure.message == "上游接口返回 500"
    assert outcome.failure.traceback is not None and "RuntimeError" in outcome.failure.traceback
    print("broken:", outcome.status.value, outcome.failure.kind.value, outcome.failure.message)

    # 4) 返回值必须可 JSON 序列化
    outcome = run_task(returns_a_set)
    assert outcome.status is TaskStatus.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.RESULT_INVALID
    assert outcome.failure.retryable is False
    print("returns_a_set:", outcome.failure.kind.value)

    print("01_first_task: OK")


if __name__ == "__main__":
    main()
