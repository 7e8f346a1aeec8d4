"""管道对它的宿主（控制器）的全部要求：一个小协议。

管道只需要四件事：按名字确认任务登记过（整条管道提交前先验完，免得提交一半才发现名字写错）、
以 blocked 一次提交全部节点、一批一批地放行节点并就地启动拿得到额度的排队任务、把不能就地做的后续工作
（要去拿任意节点的锁的连坐取消、人工停止之后的判定）交给宿主在任何锁之外执行。有了这个协议，管道不导入控制器、不碰它的私有成员，控制器的
内部怎么改都不会牵动管道。
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from chongming_task.runtime.taskrun import TaskRun


class NodeFields(TypedDict):
    """管道节点提交时的关键字参数（都必填）：协议与实现共用这一份，不各写一遍。"""

    task_id: str
    label: str
    pipeline_id: str
    node_id: str
    upstream: Mapping[str, Any]


NodeSubmit = tuple[str, tuple[Any, ...], dict[str, Any], NodeFields]
"""一个待提交的节点：(任务名, 位置参数, 关键字参数, 节点字段)。"""


class PipelineHost(Protocol):
    """管道节点的宿主。``Controller`` 实现它。"""

    def resolve_task(self, name: str) -> object:
        """名字登记过就返回它的定义，否则抛 ConfigurationError（消息说明怎么登记）。"""
        ...

    def submit_nodes(self, nodes: Sequence[NodeSubmit]) -> list[TaskRun]:
        """以 ``blocked`` 一次提交全部节点（不进就绪队列、不占额度，等管道放行）：一次写事务落库，
        返回同样顺序的句柄。"""
        ...

    def release_nodes(self, releases: Sequence[tuple[TaskRun, Mapping[str, Any] | None]]) -> None:
        """放行这批节点（``TaskRun.release(上游值)``，blocked → queued），再有空额度就启动排队的任务（各占一个
        槽、同时跑，不在调用线程上排成一串）；整批至多叫醒一次后台循环（宽扇出一次放行上万个下游）。可以在一个
        刚落终态的节点的锁内调用：被放行的是它还在 blocked 的直接下游（取锁顺着 DAG 的边），启动排队任务与
        控制器让出额度时就地启动下一个排队任务同一个取锁方向。"""
        ...

    def defer(self, work: Callable[[], None]) -> None:
        """把一件后续工作交给宿主，在任何锁之外、按提交顺序执行。"""
        ...


__all__ = ["NodeFields", "NodeSubmit", "PipelineHost"]
