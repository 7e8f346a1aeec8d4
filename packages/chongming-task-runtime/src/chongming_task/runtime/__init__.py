"""chongming-task 运行时发行包的实现：TaskRun、控制器、管道、执行器、共享看门狗与控制器的内部部件。

布局：``taskrun.py``（TaskRun / run_task，状态在运行路径上的全部写入）、``controller.py``（本地调度）、
``store_link.py``（只在有存储时才存在的那一半：写穿、租约、旁路、指令、节点登记、reconcile）、
``pipeline.py``（DAG 管道，只依赖 ``pipeline_host.PipelineHost`` 协议）、``executors/``。

公开入口是根命名空间里的薄模块 ``chongming_task.run`` / ``.controller`` / ``.pipeline`` 与
``chongming_task.runtime.executors``；这里的模块路径不是对用户的承诺。
"""
