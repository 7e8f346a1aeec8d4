"""管道只经 ``PipelineHost`` 协议用到控制器：不导入控制器（类型检查专用的导入也不行），不碰它的私有成员。"""

from __future__ import annotations

import ast
import inspect

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
    assert sorted(members) == ["defer", "resolve_task", "start_ready", "submit_nodes"]
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
