"""chongming-task 运维网页控制台（issue 21，docs/web.md）。

``chongming-task web --db tasks.db`` 启动；也可以在自己的 ASGI 服务器里挂 ``create_app(store)``。
只用 core / runtime / 存储的公开 API：查询走 ``TaskStore``，控制动作写成跨进程指令
（``submit_command``，发起者 ``web:<操作者>``），体检与 reconcile 走 ``Controller``。
"""

from __future__ import annotations

from chongming_task.web.app import WebConsole, WebSettings, create_app
from chongming_task.web.server import serve

__all__ = ["WebConsole", "WebSettings", "create_app", "serve"]
