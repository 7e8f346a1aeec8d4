"""``with`` 语句支持的唯一一份实现：进入时交回对象本身，离开时调用 ``close()``。

存储（``TaskStore``）与控制器（``Controller``）都是"用完必须关"的资源；两处曾各写一份一模一样的
``__enter__`` / ``__exit__``。放在 core 里，runtime 与各后端都能用（依赖方向不变）。
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ClosesOnExit:
    """混入类：``with obj:`` 结束时调用 ``obj.close()``；异常照常向外抛（``__exit__`` 不吞异常）。"""

    __slots__ = ()

    def close(self) -> None:
        """子类实现：释放资源，且必须幂等（``with`` 之后再手动 close 不能出错）。"""
        raise NotImplementedError(f"{type(self).__name__} 必须实现 close()")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["ClosesOnExit"]
