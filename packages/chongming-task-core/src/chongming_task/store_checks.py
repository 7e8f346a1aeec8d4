"""写后端用的入参校验（旧路径，保留）：实现在 ``chongming_task.core.storage.checks``，这里只重新导出。"""

from __future__ import annotations

from chongming_task.core.storage.checks import (
    check_aware,
    check_claimant,
    check_count,
    check_optional_text,
    check_snapshot,
    check_transitions,
    claim_args,
    command_args,
    id_set,
)

__all__ = [
    "check_aware",
    "check_claimant",
    "check_count",
    "check_optional_text",
    "check_snapshot",
    "check_transitions",
    "claim_args",
    "command_args",
    "id_set",
]
