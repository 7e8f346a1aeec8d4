"""StoreContract 的实现，按存储流量的种类拆成模块；每个模块一个 mixin，都继承 ``ContractBase``。

=====================  ==============================================================
模块                   覆盖的流量
=====================  ==============================================================
``_base``              测试数据（``snap`` / ``step`` / ``walk`` / ``full_snapshot`` / ``node``）、
                       实现者钩子、共用断言
``snapshots``          create / get、字段保真、副本语义
``saves``              save 的乐观并发与竞争
``queries``            query / stats / bucket_counts
``history``            迁移历史 append / history
``touch``              旁路字段（进度、心跳、租约）
``commands``           命令队列：提交、认领、租约、完成、释放
``nodes``              节点成员表
``housekeeping``       prune 与 close
=====================  ==============================================================

公开入口只有 ``chongming_task.testing.store_contract.StoreContract``（组合了全部 mixin）；这里的
模块划分是实现细节，改动时不必保持兼容。新增一类存储流量，就新增一个模块与 mixin，并把它加进
``StoreContract`` 的基类列表。
"""
