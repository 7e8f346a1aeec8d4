"""异常层级（用户指南 §12）：逐个核对父类，TaskCancelled 单独站在 BaseException 下。"""

from __future__ import annotations

import pickle

import pytest

import chongming_task
from chongming_task import errors
from chongming_task.errors import (
    AttemptsExhausted,
    CircularDependency,
    ConcurrencyConflict,
    ConfigurationError,
    DependencyFailed,
    InvalidTransition,
    StoreError,
    TaskCancelled,
    TaskError,
    TaskExecutionError,
    TaskTimeout,
)
from chongming_task.states import TRANSITIONS, TaskStatus

GUIDE_CHILDREN = [
    InvalidTransition,
    DependencyFailed,
    CircularDependency,
    TaskTimeout,
    TaskExecutionError,
    AttemptsExhausted,
    ConcurrencyConflict,
    StoreError,
    ConfigurationError,
]


def test_task_error_is_an_exception() -> None:
    assert TaskError.__bases__ == (Exception,)


@pytest.mark.parametrize("cls", GUIDE_CHILDREN, ids=lambda c: c.__name__)
def test_every_guide_error_is_a_direct_task_error(cls: type[Exception]) -> None:
    assert cls.__bases__[0] is TaskError
    assert issubclass(cls, TaskError)
    assert not issubclass(cls, TaskCancelled)


def test_guide_errors_are_not_subclasses_of_each_other() -> None:
    for left in GUIDE_CHILDREN:
        for right in GUIDE_CHILDREN:
            if left is not right:
                assert not issubclass(left, right), (left, right)


def test_task_cancelled_stands_alone() -> None:
    assert TaskCancelled.__bases__ == (BaseException,)
    assert not issubclass(TaskCancelled, Exception)
    assert not issubclass(TaskCancelled, TaskError)


def test_except_exception_does_not_swallow_cancellation() -> None:
    # §12.1 的那条专门用例：except Exception 包住循环，取消信号照样穿出去。
    swallowed: list[BaseException] = []

    def loop() -> None:
        for step in range(10):
            try:
                if step == 3:
                    raise TaskCancelled("发布窗口")
            except Exception as exc:
                swallowed.append(exc)

    with pytest.raises(TaskCancelled) as info:
        loop()
    assert swallowed == []
    assert info.value.reason == "发布窗口"
    assert str(info.value) == "发布窗口"
    assert str(TaskCancelled()) == "任务已被请求停止"


def test_task_execution_error_keeps_cause() -> None:
    original = ZeroDivisionError("division by zero")
    try:
        try:
            raise original
        except ZeroDivisionError as exc:
            raise TaskExecutionError("任务体抛出了异常") from exc
    except TaskExecutionError as wrapped:
        assert wrapped.__cause__ is original
        assert wrapped.__suppress_context__ is True
        assert isinstance(wrapped, TaskError)


def test_invalid_transition_attributes() -> None:
    error = InvalidTransition(
        TaskStatus.RUNNING, TaskStatus.QUEUED, "x:y", TRANSITIONS[TaskStatus.RUNNING], "细节"
    )
    assert error.from_status is TaskStatus.RUNNING
    assert error.to_status is TaskStatus.QUEUED
    assert error.action == "x:y"
    assert error.allowed == TRANSITIONS[TaskStatus.RUNNING]
    assert isinstance(error.allowed, frozenset)
    assert error.detail == "细节"
    assert str(error).endswith("；细节")


@pytest.mark.parametrize(
    "error",
    [
        InvalidTransition(TaskStatus.SUCCEEDED, TaskStatus.RUNNING, "executor:launched", frozenset()),
        InvalidTransition(
            TaskStatus.PAUSED, TaskStatus.RUNNING, "a", TRANSITIONS[TaskStatus.PAUSED], "detail"
        ),
        CircularDependency(["a", "b", "a"]),
        TaskCancelled("停"),
        TaskCancelled(),
        ConfigurationError("坏配置"),
        TaskExecutionError("x"),
    ],
    ids=repr,
)
def test_errors_survive_pickling(error: BaseException) -> None:
    # 进程执行器要把异常带过进程边界。
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back) == vars(error)


def test_circular_dependency_message() -> None:
    error = CircularDependency(("fetch", "load", "fetch"))
    assert error.cycle == ("fetch", "load", "fetch")
    assert str(error) == "依赖成环：fetch -> load -> fetch"


def test_configuration_error_is_also_a_value_error() -> None:
    assert issubclass(ConfigurationError, ValueError)


def test_errors_exported_from_the_facade() -> None:
    for cls in [TaskError, TaskCancelled, *GUIDE_CHILDREN]:
        assert getattr(chongming_task, cls.__name__) is cls
        assert cls.__name__ in errors.__all__
