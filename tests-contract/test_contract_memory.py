"""内存存储跑完整的持久层契约套件。它是其他后端的参照物：契约的语义先在这里成立。"""

from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing import store_contract


class TestInMemoryStoreContract(store_contract.StoreContract):
    def make_store(self) -> InMemoryTaskStore:
        return InMemoryTaskStore()
