"""管道只经 ``PipelineHost`` 协议用到控制器：不导入控制器（类型检查专用的导入也不行），不碰它的私有成员。"""

from __future__ import annotations

import ast
import inspect

import pytest

from chongming_task import ConfigurationError
from chongming_task.runtime import pipeline
from chongming_task.runtime.controller import Controller
from chongming_task.runtime.pipeline_host import NodeFields, PipelineHost


def _tree() -> ast.Module:
    return ast.parse(inspect.getsource(pipeline))


def test_pipeline_does_not_import_the_controller() -> None:
    imported = set()
    for node in ast.walk(_tree()):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert imported, "没解析到任何导入：扫描本身失效了"
    assert not {m for m in imported if m.endswith("controller")}, imported


def test_pipeline_uses_no_private_member_of_its_host() -> None:
    private = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(_tree())
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in {"host", "controller"}
    ]
    assert private == []


def test_controller_implements_the_host_protocol() -> None:
    members = [name for name in dir(PipelineHost) if not name.startswith("_")]
    assert sorted(members) == ["defer", "release_nodes", "resolve_task", "submit_nodes"]
    for name in members:
        assert callable(getattr(Controller, name)), name
        assert not name.startswith("_")
    with Controller(max_parallel=1) as controller:
        host: PipelineHost = controller  # mypy 在这里检查结构是否匹配
        controller.register("double", lambda ctx, x: 2 * x)
        fields: NodeFields = {
            "task_id": "p:n",
            "label": "p/n",
            "pipeline_id": "p",
            "node_id": "n",
            "upstream": {},
        }
        [run] = host.submit_nodes([("double", (21,), {}, fields)])
        assert run.status.value == "blocked"
        assert run.release() is True
        assert run.wait(timeout=10).value == 42


def test_nodes_after_the_first_are_copied_from_a_template_and_still_checked() -> None:
    """submit_nodes 只完整校验第一个节点的快照，其余的复制它、换上自己的
    task_id / label / node_id / 创建时间：复制出的与完整构造的只差这几个字段，历史一样；
    换上的值照样校验（第二个节点的坏 node_id 照样被拒绝）。"""
    with Controller(max_parallel=1) as controller:
        controller.register("double", lambda ctx, x: 2 * x)

        def fields(node_id: str, task_id: str | None = None) -> NodeFields:
            return {
                "task_id": task_id or f"p:{node_id}",
                "label": f"p/{task_id or node_id}",
                "pipeline_id": "p",
                "node_id": node_id,
                "upstream": {},
            }

        first, second, third = controller.submit_nodes(
            [("double", (i,), {}, fields(node)) for i, node in enumerate(["a", "b", "c"])]
        )
        varying = {"task_id", "label", "node_id", "created_at"}
        for copied in (second, third):
            snap, base = copied.snapshot, first.snapshot
            assert snap.task_id == f"p:{snap.node_id}" and snap.label == f"p/{snap.node_id}"
            assert snap.created_at >= base.created_at
            same = {k: v for k, v in vars(snap).items() if k not in varying}
            assert same == {k: v for k, v in vars(base).items() if k not in varying}
            assert [(t.from_status, t.to_status, t.trigger) for t in copied.transitions] == [
                (t.from_status, t.to_status, t.trigger) for t in first.transitions
            ]
        with pytest.raises(ConfigurationError, match="node_id"):
            controller.submit_nodes(
                [("double", (1,), {}, fields("ok")), ("double", (2,), {}, fields("bad\x00", task_id="p:bad"))]
            )
        with pytest.raises(ConfigurationError, match="task_id"):
            controller.submit_nodes(
                [("double", (1,), {}, fields("x")), ("double", (2,), {}, fields("y" * 600))]
            )
        assert sorted(s.task_id for s in controller.list_tasks()) == ["p:a", "p:b", "p:c"]
        for run in (first, second, third):
            assert run.release() is True
        assert [run.wait(timeout=10).value for run in (first, second, third)] == [0, 2, 4]
