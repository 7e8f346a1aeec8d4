"""``Read``：只读属性的一行写法。

一串 ``@property def x(self): return self._x`` 只是"把某个字段原样读出来"，写成一张表更好读::

    class TaskContext:
        task_id = Read[str]("_task_id")
        attempt = Read[int]("_attempt", doc="本次尝试的序号（从 1 起）。")

路径可以带点（``Read[str]("record.task_id")`` 读 ``self.record.task_id``）。没有 setter：
给它赋值与给 property 赋值一样抛 AttributeError（带 ``__slots__`` 或 frozen 的类）。
"""

from __future__ import annotations

from operator import attrgetter
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class Read(Generic[T]):
    """只读属性：读出 ``path`` 指向的字段（不拷贝）。"""

    def __init__(self, path: str, *, doc: str | None = None) -> None:
        self._get = attrgetter(path)
        self.__doc__ = doc

    @overload
    def __get__(self, obj: None, owner: type) -> Read[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object, owner: type) -> T | Read[T]:
        if obj is None:
            return self
        return self._get(obj)  # type: ignore[no-any-return]


__all__ = ["Read"]
