# chongming-task 的开发入口。除了 python3 之外什么都不假设；一切都装进仓库根目录的 .venv/，不碰全局环境。
#
#   make install   建 .venv/，可编辑安装全部发行包 + requirements-dev.txt（增量：pyproject 或依赖清单变了才重装）
#   make test      install + ruff format --check + ruff check + mypy --strict + pytest（含 packaging 测试）
#   make demo      在 SQLite 文件上跑主流程演示（examples/demo.py）
#   make lint / fmt / types / build / bench / clean

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.chongming-installed

# 成员顺序无关紧要（pip 一次解析），但列出来便于阅读；伞包放最后。
MEMBERS := \
	packages/chongming-task-core \
	packages/chongming-task-runtime \
	packages/chongming-task-store-sqlite \
	packages/chongming-task-store-postgres \
	packages/chongming-task-cli \
	packages/chongming-task-web \
	packages/chongming-task

# mypy 的检查对象：等价于 packages/*/src，但跳过还没有任何 .py 的成员（否则 mypy 报 "no .py files" 而失败）。
# 所有成员都有代码之后，它就是 packages/*/src 全体。
TYPED_SRCS = $(foreach d,$(wildcard packages/*/src),$(if $(shell find $(d) -name '*.py' -print -quit),$(d)))

# 任何一个 pyproject / 依赖清单变了，stamp 就过期，make install 会重新安装。
INSTALL_INPUTS := pyproject.toml requirements-dev.txt $(wildcard packages/*/pyproject.toml)

.PHONY: help install test lint fmt types pytest demo build bench clean

help:
	@echo "make install | test | demo | lint | fmt | types | build | bench | clean"

install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	@test -x $(PY) || { \
		$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
			|| { echo "需要 Python >= 3.11：$$($(PYTHON) --version 2>&1)（可用 make PYTHON=python3.12 ... 指定）" >&2; exit 1; }; \
		echo ">>> 创建 $(VENV)/"; $(PYTHON) -m venv $(VENV); \
	}
	$(PY) -m pip install --quiet --upgrade "$$(grep -E '^pip==' requirements-dev.txt)"
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@# --no-build-isolation：hatchling 已在 .venv 里（见 requirements-dev.txt），不必为每个包再建隔离构建环境。
	$(PY) -m pip install --quiet --no-build-isolation $(addprefix -e ,$(MEMBERS))
	@touch $@
	@echo ">>> $(VENV)/ 已就绪"

test: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy --strict $(TYPED_SRCS)
	$(BIN)/pytest

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

types: install
	$(BIN)/mypy --strict $(TYPED_SRCS)

pytest: install
	$(BIN)/pytest $(ARGS)

demo: install
	@test -f examples/demo.py || { echo "examples/demo.py 还不存在：演示脚本尚未写好（见 README 状态表）" >&2; exit 1; }
	$(PY) examples/demo.py

# dist/ 里得到每个发行包（含伞包）的 wheel + sdist。
build: install
	rm -rf dist
	@for m in $(MEMBERS); do \
		echo ">>> build $$m"; \
		$(PY) -m build --quiet --no-isolation --outdir dist $$m; \
	done
	@ls -1 dist

# 对照组（huey、procrastinate、dbos、pgqueuer）只在跑基准时装进 .venv，不是任何发行包的依赖；
# 一个基准失败不打断其余基准，最后列出失败的脚本并以非零退出。
bench: install
	$(PY) -m pip install --quiet -r requirements-bench.txt
	@shopt -s nullglob; files=(bench/bench_*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "bench/ 里还没有 bench_*.py"; exit 0; fi; \
	failed=(); for f in "$${files[@]}"; do echo ">>> $$f"; $(PY) "$$f" || failed+=("$$f"); done; \
	if [ $${#failed[@]} -gt 0 ]; then echo "这些基准异常退出（其余已照常跑完）：$${failed[*]}"; exit 1; fi

clean:
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find packages -maxdepth 3 -name '*.egg-info' -type d -prune -exec rm -rf {} +
