"""触发源（trigger）：每条迁移记录里"是谁/什么事件引起的"。这里是**唯一**的清单。

trigger 出现在迁移历史、CLI 的 ``history`` 输出与 InvalidTransition 的错误消息里，运维据此回答
"任务为什么变成这样"。所以每个名字只在这里写一次：状态机的默认值、运行时（TaskRun）、控制器、
管道、reconcile 都引用这里的常量，源码的其他地方不写 trigger 字符串（``core/tests/test_triggers.py``
扫描 ``packages/*/src`` 守住这一条）。

命名是 ``来源:事件``：

* ``scheduler:`` / ``executor:`` / ``runtime:``——调度、载体与监督逻辑的自然推进；
* ``control:``——人（或代表人的指令）按下的控制动作；
* ``orchestrator:`` / ``pipeline:``——编排层（连坐取消、依赖放行/失败）；
* ``reconcile:``——重启恢复时对失去监督者的任务的判定。

``AUDITED_TRIGGERS`` 是"离开转移表"这条规则查的那一个集合：历史里一条不是表中边的记录，必须带其中
之一；普通 mark_* 动作不得冒用它们（否则审计轨迹里会出现没有 actor/reason 的"强制跳转"）。
"""

from __future__ import annotations

# -- 状态机各动作的默认触发源 ----------------------------------------------------------------------
TRIGGER_BLOCKED = "scheduler:blocked"
TRIGGER_QUEUED = "scheduler:queued"
TRIGGER_STARTING = "scheduler:dispatched"
TRIGGER_RUNNING = "executor:launched"
TRIGGER_SUCCEEDED = "executor:returned"
TRIGGER_FAILED = "executor:failed"
TRIGGER_RETRY_WAIT = "runtime:retry_scheduled"
TRIGGER_PAUSING = "control:pause"
TRIGGER_PAUSED = "runtime:paused"
TRIGGER_PAUSE_ABORTED = "runtime:pause_aborted"
TRIGGER_STOPPING = "control:stop"
TRIGGER_STOPPED = "runtime:stopped"
TRIGGER_CANCELLED = "orchestrator:cancelled"
TRIGGER_SKIPPED = "orchestrator:skipped"
TRIGGER_LOST = "runtime:lost"

# -- 三个不受转移表约束的显式入口 --------------------------------------------------------------------
TRIGGER_RETRY = "control:retry"
TRIGGER_RESET = "control:reset"
TRIGGER_FORCE = "control:force"

# -- 运行时（TaskRun）----------------------------------------------------------------------------
TRIGGER_START = "runtime:start"
"""start() 被拒绝时 InvalidTransition 里记的触发源（不产生迁移记录）。"""
TRIGGER_PAUSE = TRIGGER_PAUSING
"""未启动的任务直接暂停（queued / retry_wait → paused）：同一个人工动作，同一个名字。"""
TRIGGER_STOP = TRIGGER_STOPPING
"""人工停止：进 stopping，或未占槽的任务直接落 stopped，或唤醒暂停中的任务去响应停止。"""
TRIGGER_RESUME = "control:resume"
TRIGGER_CARRIER_EXITED = "runtime:carrier_exited"
TRIGGER_CANCEL = "orchestrator:cancel"
TRIGGER_RETRY_DUE = "runtime:retry_due"
"""重试等待到期，由控制器放回就绪队列（retry_wait → queued）。"""
TRIGGER_TIMEOUT_START = "runtime:timeout_start"
"""start 超时：排队中没拿到执行槽（queued → stopped），或载体迟迟没就位、这次尝试记成 timeout_start 失败。"""
TRIGGER_TIMEOUT_ATTEMPT = "runtime:timeout_attempt"
"""per_attempt 超时：本次尝试记成 timeout_attempt 失败（→ failed / retry_wait），任务 return 也一样。"""
TRIGGER_TIMEOUT_IDLE = "runtime:timeout_idle"
"""idle 超时：这次尝试记成 timeout_idle 失败（→ failed / retry_wait），任务以 return 响应停止也一样。"""

# -- 编排层与重启恢复 --------------------------------------------------------------------------------
TRIGGER_RELEASED = "pipeline:released"
"""管道节点的上游都满足了（blocked → queued）。"""
TRIGGER_DEPENDENCY_FAILED = "pipeline:dependency_failed"
"""管道节点的上游失败，按 join 规则不再执行（blocked → skipped）。"""
TRIGGER_RECONCILE = "reconcile:lease_expired"
"""租约过期、占着执行资源的任务被判为 lost。"""
TRIGGER_ADOPTED = "cluster:adopted"
"""持久任务的持有者失联（租约过期）：一个负责该桶的活 worker 接手它。状态不变，只换持有者（issue 19）。"""

AUDITED_TRIGGERS: frozenset[str] = frozenset({TRIGGER_RETRY, TRIGGER_RESET, TRIGGER_FORCE})
"""不受转移表约束的三个显式入口的触发源（见模块说明）。"""

ALL_TRIGGERS: frozenset[str] = frozenset(
    {
        TRIGGER_BLOCKED,
        TRIGGER_QUEUED,
        TRIGGER_STARTING,
        TRIGGER_RUNNING,
        TRIGGER_SUCCEEDED,
        TRIGGER_FAILED,
        TRIGGER_RETRY_WAIT,
        TRIGGER_PAUSING,
        TRIGGER_PAUSED,
        TRIGGER_PAUSE_ABORTED,
        TRIGGER_STOPPING,
        TRIGGER_STOPPED,
        TRIGGER_CANCELLED,
        TRIGGER_SKIPPED,
        TRIGGER_LOST,
        TRIGGER_RETRY,
        TRIGGER_RESET,
        TRIGGER_FORCE,
        TRIGGER_START,
        TRIGGER_PAUSE,
        TRIGGER_STOP,
        TRIGGER_RESUME,
        TRIGGER_CARRIER_EXITED,
        TRIGGER_CANCEL,
        TRIGGER_RETRY_DUE,
        TRIGGER_TIMEOUT_START,
        TRIGGER_TIMEOUT_ATTEMPT,
        TRIGGER_TIMEOUT_IDLE,
        TRIGGER_RELEASED,
        TRIGGER_DEPENDENCY_FAILED,
        TRIGGER_RECONCILE,
        TRIGGER_ADOPTED,
    }
)
"""本库会写进迁移历史（或错误消息）的全部触发源。"""

SOURCE_PREFIXES: frozenset[str] = frozenset(trigger.partition(":")[0] for trigger in ALL_TRIGGERS)
"""触发源的来源前缀（``control`` / ``runtime`` / ...），供源码扫描识别"长得像 trigger"的字面量。"""


__all__ = [
    "ALL_TRIGGERS",
    "AUDITED_TRIGGERS",
    "SOURCE_PREFIXES",
    "TRIGGER_ADOPTED",
    "TRIGGER_BLOCKED",
    "TRIGGER_CANCEL",
    "TRIGGER_CANCELLED",
    "TRIGGER_CARRIER_EXITED",
    "TRIGGER_DEPENDENCY_FAILED",
    "TRIGGER_FAILED",
    "TRIGGER_FORCE",
    "TRIGGER_LOST",
    "TRIGGER_PAUSE",
    "TRIGGER_PAUSED",
    "TRIGGER_PAUSE_ABORTED",
    "TRIGGER_PAUSING",
    "TRIGGER_QUEUED",
    "TRIGGER_RECONCILE",
    "TRIGGER_RELEASED",
    "TRIGGER_RESET",
    "TRIGGER_RESUME",
    "TRIGGER_RETRY",
    "TRIGGER_RETRY_DUE",
    "TRIGGER_RETRY_WAIT",
    "TRIGGER_RUNNING",
    "TRIGGER_SKIPPED",
    "TRIGGER_START",
    "TRIGGER_STARTING",
    "TRIGGER_STOP",
    "TRIGGER_STOPPED",
    "TRIGGER_STOPPING",
    "TRIGGER_SUCCEEDED",
    "TRIGGER_TIMEOUT_ATTEMPT",
    "TRIGGER_TIMEOUT_IDLE",
    "TRIGGER_TIMEOUT_START",
]
