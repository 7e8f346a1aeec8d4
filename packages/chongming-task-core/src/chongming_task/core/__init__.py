"""状态机所在的子包（``chongming_task.core.state_machine``）。"""
