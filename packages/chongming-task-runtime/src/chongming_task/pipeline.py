"""公开路径 ``chongming_task.pipeline``：DAG 管道（Pipeline、PipelineRun，永久有效的导入路径）。

实现在 ``chongming_task.runtime.pipeline``。这里只做转出，不定义任何东西。
"""

from __future__ import annotations

from chongming_task.runtime.pipeline import (
    NodeHandle,
    Pipeline,
    PipelineOutcome,
    PipelineRun,
    pipeline_verdict,
    submit_pipeline,
)

__all__ = ["NodeHandle", "Pipeline", "PipelineOutcome", "PipelineRun", "pipeline_verdict", "submit_pipeline"]
