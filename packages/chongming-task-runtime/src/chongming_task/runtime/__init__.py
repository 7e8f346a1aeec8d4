"""chongming-task 运行时：执行器、共享看门狗与控制器的内部部件。

公开入口在 ``chongming_task.run``（TaskRun、run_task）与 ``chongming_task.runtime.executors``。
"""
