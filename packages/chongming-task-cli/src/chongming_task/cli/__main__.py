"""``python -m chongming_task.cli``：与 console script ``chongming-task`` 相同。"""

from chongming_task.cli import main

main()
