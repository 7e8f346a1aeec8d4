"""SQL 后端共用的推导：由 ``columns`` 的列表得出物理列、DDL 与"记录 ↔ 行"的编解码（只用标准库）。

SQLite 与 PostgreSQL 的 codec 曾是树里最大的一对重复代码：同一份 31 个字段的清单手写了好几遍，
只有"时间怎么存、JSON 怎么存、占位符怎么写"不同。现在两个后端各写一个 ``SqlDialect`` 子类，只实现
这几处钩子；其余（列清单、save 不碰的旁路列、快照 ↔ 行参数、建表语句）都在这里推导一次。

钩子（子类必须实现）：

* ``time_columns`` / ``encode_time`` / ``decode_time``：一个时间字段占哪几列、怎么拆、怎么合；
* ``encode_json`` / ``decode_json``：JSON 值（含 None）的存法；
* ``encode_tags`` / ``decode_tags``、``encode_buckets`` / ``decode_buckets``：集合的存法；
* ``sql_type``：逻辑类型 → 物理类型名；``column_constraints``：NOT NULL 之外的约束（COLLATE、CHECK…）。

可选钩子：``check_text``（存储介质对文本的额外限制，例如 PostgreSQL 拒绝 NUL）。
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

from chongming_task.core.recipes import Recipe
from chongming_task.core.records import NO_TAGS, snapshot_from_state
from chongming_task.core.storage.columns import (
    COMMAND_COLUMNS,
    NODE_COLUMNS,
    TASK_COLUMNS,
    TRANSITION_COLUMNS,
    Column,
    Kind,
)
from chongming_task.core.storage.values import Command, CommandAction, NodeRecord
from chongming_task.errors import TaskError
from chongming_task.models import Failure, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus


def escape_like(prefix: str, escape: str = "\\") -> str:
    """把前缀转成 LIKE 模式：``%`` ``_`` 与转义符本身按字面匹配，再在末尾加 ``%``。"""
    escaped = prefix.replace(escape, escape + escape).replace("%", escape + "%").replace("_", escape + "_")
    return escaped + "%"


_Encoder = Callable[[Any], tuple[Any, ...]]
_Decoder = Callable[[Sequence[Any]], Any]


class SqlDialect(ABC):
    """一个 SQL 方言的编码钩子（见模块说明）。实例无状态，可在线程间共享。"""

    # -- hooks ----------------------------------------------------------------------------------------

    @abstractmethod
    def time_columns(self, column: Column) -> tuple[str, ...]:
        """时间字段对应的物理列名（第一个总是字段名本身）。"""

    @abstractmethod
    def encode_time(self, column: Column, value: datetime | None) -> tuple[Any, ...]:
        """时间 → ``time_columns(column)`` 各列的值。"""

    @abstractmethod
    def decode_time(self, values: Sequence[Any]) -> datetime | None:
        """``time_columns`` 各列的值 → 带原始偏移的时间。"""

    @abstractmethod
    def encode_json(self, value: Any, what: str) -> Any:
        """JSON 值（None 是 JSON null）→ 列值。坏值在这里抛 ConfigurationError，在动数据库之前。"""

    @abstractmethod
    def decode_json(self, raw: Any) -> Any:
        """列值 → JSON 值（每次都是新对象，调用方改它碰不到存储）。"""

    @abstractmethod
    def encode_tags(self, tags: list[str]) -> Any:
        """升序的标签列表 → 列值。"""

    @abstractmethod
    def decode_tags(self, raw: Any) -> frozenset[str]: ...

    @abstractmethod
    def encode_buckets(self, buckets: list[int] | None) -> Any:
        """升序的桶号列表或 None → 列值（None 与空列表必须存得不同）。"""

    @abstractmethod
    def decode_buckets(self, raw: Any) -> frozenset[int] | None: ...

    @abstractmethod
    def sql_type(self, column: Column) -> str:
        """逻辑列的物理类型名（时间字段是第一列的类型；附加列见 ``extra_ddl``）。"""

    @abstractmethod
    def extra_ddl(self, column: Column) -> list[str]:
        """时间字段附加列（排序键 / 偏移）的列定义，按 ``time_columns`` 的顺序。"""

    def column_constraints(self, column: Column) -> str:
        """类型之后、逗号之前的约束文本（含前导空格）。默认：主键 / NOT NULL。"""
        if column.primary_key:
            return " PRIMARY KEY NOT NULL"
        return "" if self.sql_nullable(column) else " NOT NULL"

    def sql_nullable(self, column: Column) -> bool:
        return column.nullable

    def check_text(self, value: str | None, what: str) -> str | None:
        """存储介质对文本的额外限制；默认不限。"""
        return value

    def format_column(self, name: str, definition: str) -> str:
        """一行列定义（方言可以对齐排版）。"""
        return f"{name} {definition}"

    # -- derivation -----------------------------------------------------------------------------------

    def physical(self, column: Column) -> tuple[str, ...]:
        """逻辑列 → 物理列名。"""
        return self.time_columns(column) if column.kind is Kind.TIMESTAMP else (column.name,)

    def column_lines(self, columns: Iterable[Column]) -> list[str]:
        """建表语句里的列定义，每个物理列一行。"""
        lines: list[str] = []
        for column in columns:
            definition = self.sql_type(column) + self.column_constraints(column)
            lines.append(self.format_column(column.name, definition))
            lines.extend(self.extra_ddl(column))
        return lines

    def encoder(self, column: Column, label: str, json_label: str) -> _Encoder:
        """字段值 → 物理列值的元组。``label`` / ``json_label`` 是报错里字段名的前缀（例如"快照字段 "）。"""
        kind = column.kind
        what = f"{label}{column.name}"
        json_what = f"{json_label}{column.name}"
        if kind is Kind.TEXT:
            check = self.check_text
            return lambda value: (check(value, what),)
        if kind is Kind.INT:
            return lambda value: (value,)
        if kind in (Kind.STATUS, Kind.ACTION):
            # ``_value_`` 是枚举成员的实例属性，``.value`` 是走 enum 描述符的属性（每次约 0.4 µs，每写一个
            # 任务要三次：状态列与迁移记录的两端）。不是枚举成员的值同样抛 AttributeError。
            return lambda value: (value._value_,)
        if kind is Kind.TIMESTAMP:
            return lambda value: self.encode_time(column, value)
        if kind is Kind.JSON:
            return lambda value: (self.encode_json(value, json_what),)
        if kind is Kind.RECIPE:
            # 只编码、不改字典：不必深拷参数（Recipe.to_dict 的 copy 参数说明了为什么文本不变）。
            return lambda value: (
                None if value is None else self.encode_json(value.to_dict(copy=False), json_what),
            )
        if kind in (Kind.PROGRESS, Kind.FAILURE):
            return lambda value: (None if value is None else self.encode_json(value.to_dict(), json_what),)
        if kind is Kind.TAGS:
            # 绝大多数任务没有标签：空集合的编码每次都一样，不必每次排序、再走一遍 JSON 编码器。
            no_tags = (self.encode_tags([]),)
            return lambda value: (
                no_tags if not value and value is not None else (self.encode_tags(sorted(value)),)
            )
        if kind is Kind.BUCKETS:
            return lambda value: (self.encode_buckets(None if value is None else sorted(value)),)
        raise AssertionError(f"未处理的列类型 {kind}")  # pragma: no cover - 加了 Kind 却没加编码

    def decoder(self, column: Column) -> _Decoder:
        """物理列值（一段切片）→ 字段值。"""
        kind = column.kind
        if kind in (Kind.TEXT, Kind.INT):
            return lambda values: values[0]
        if kind is Kind.STATUS:
            return _decode_status
        if kind is Kind.ACTION:
            return lambda values: CommandAction(values[0])
        if kind is Kind.TIMESTAMP:
            return self.decode_time
        if kind is Kind.JSON:
            return lambda values: self.decode_json(values[0])
        if kind in (Kind.PROGRESS, Kind.FAILURE, Kind.RECIPE):
            record: Any = {Kind.PROGRESS: Progress, Kind.FAILURE: Failure, Kind.RECIPE: Recipe}[kind]
            return lambda values: None if values[0] is None else record.from_dict(self.decode_json(values[0]))
        if kind is Kind.TAGS:
            return lambda values: self.decode_tags(values[0])
        if kind is Kind.BUCKETS:
            return lambda values: self.decode_buckets(values[0])
        raise AssertionError(f"未处理的列类型 {kind}")  # pragma: no cover


_STATUS_BY_VALUE = {status.value: status for status in TaskStatus}


def _decode_status(values: Sequence[Any]) -> TaskStatus:
    # 查表比 TaskStatus(value)（Enum.__call__）快几倍；未知的值照样由 TaskStatus(...) 报 ValueError。
    found = _STATUS_BY_VALUE.get(values[0])
    return TaskStatus(values[0]) if found is None else found


class RowCodec:
    """一张列表（``columns``）在某个方言下的编解码：记录 ↔ 物理列。构造时编译好每列的函数。"""

    def __init__(
        self, dialect: SqlDialect, columns: Sequence[Column], label: str, json_label: str = ""
    ) -> None:
        self.dialect = dialect
        self.logical = tuple(columns)
        self.names: tuple[str, ...] = tuple(name for c in columns for name in dialect.physical(c))
        """全部物理列，按表里的顺序：SELECT / INSERT 的列清单。"""
        self._encoders = [
            (c.name, dialect.physical(c), dialect.encoder(c, label, json_label)) for c in columns
        ]
        # params() 是每次写入的热路径（每次状态迁移至少两次）：按列预先分成几种做法，省掉逐列的 zip 与
        # dict.update。原样存的列（整数；方言不另做检查的文本）直接取值；值为 None 的列取构造时算好的
        # 编码结果（新建的任务大半列是 None：时间戳、failure、outcome……不必每次都走一遍编码函数）；
        # 一个物理列的取编码结果的第一项，其余（时间戳的两列）照旧。键的顺序与 names 一致。
        plain_text = type(dialect).check_text is SqlDialect.check_text
        self._plan: list[tuple[str, str | tuple[str, ...], _Encoder | None, tuple[Any, ...] | None]] = []
        for c, (field_name, physical, encode) in zip(columns, self._encoders, strict=True):
            if len(physical) == 1 and (c.kind is Kind.INT or (c.kind is Kind.TEXT and plain_text)):
                self._plan.append((field_name, physical[0], None, None))
                continue
            try:
                null: tuple[Any, ...] | None = encode(None)  # 编码是纯函数：None 的结果每次都一样
            except (AttributeError, TypeError, ValueError, TaskError):
                null = None  # 这一列不接受 None（标签集合）：照常编码，让它自己报错
            self._plan.append((field_name, physical[0] if len(physical) == 1 else physical, encode, null))
        self.params: Callable[[object], dict[str, Any]] = _compile_params(self._plan)
        """记录 → {物理列名: 值}（命名参数），由上面的计划编译成一个函数（见 ``_compile_params``）。"""
        self.values: Callable[[object], tuple[Any, ...]] = _compile_params(self._plan, as_tuple=True)
        """记录 → 按 ``names`` 顺序的一行：与 ``tuple(params(记录).values())`` 逐项相同，不造中间的字典。"""
        self.values_like: Callable[[object, object, Sequence[Any]], tuple[Any, ...]] = _compile_values_like(
            self._plan
        )
        """``(记录, 上一条记录, 上一条记录的行)`` → 这条记录按 ``names`` 顺序的一行
        （见 ``_compile_values_like``）：与 ``tuple(params(记录).values())`` 逐项相同，只是与上一条记录
        是同一个对象的字段直接取上一行里的编码。只用于同一次调用里的记录（``create_many`` 的一批）。"""
        decoders: list[tuple[str, slice, _Decoder]] = []
        offset = 0
        for column in columns:
            width = len(dialect.physical(column))
            decoders.append((column.name, slice(offset, offset + width), dialect.decoder(column)))
            offset += width
        self._decoders = decoders

    def params_by_plan(self, record: object) -> dict[str, Any]:
        """``params`` 的解释执行版（逐列走计划）：编译版的参照，测试用它对照两者逐键相同。"""
        return self._encode(record, self._plan)

    def _encode(
        self,
        record: object,
        plan: Sequence[tuple[str, str | tuple[str, ...], _Encoder | None, tuple[Any, ...] | None]],
    ) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for field_name, physical, encode, null in plan:
            value = getattr(record, field_name)
            if encode is None:
                params[physical] = value  # type: ignore[index]
                continue
            encoded = null if value is None and null is not None else encode(value)
            if isinstance(physical, str):
                params[physical] = encoded[0]
            else:
                params.update(zip(physical, encoded, strict=True))
        return params

    def fields(self, row: Sequence[Any]) -> dict[str, Any]:
        """按 ``names`` 顺序的一行 → {字段名: 值}。"""
        return {name: decode(row[part]) for name, part, decode in self._decoders}

    def column_lines(self) -> list[str]:
        return self.dialect.column_lines(self.logical)


def _compile_params(
    plan: Sequence[tuple[str, str | tuple[str, ...], _Encoder | None, tuple[Any, ...] | None]],
    *,
    as_tuple: bool = False,
) -> Callable[[object], Any]:
    """把逐列的编码计划编译成一个函数：一次属性读、一个字典字面量，没有逐列的循环、元组解包与分支。

    为什么编译：``params`` 是每次写入的热路径（快照 45 列、每次迁移两行），``submit_many`` 十万个任务时
    它是存储一侧最大的一块 Python 开销；解释执行的计划每列要付一轮循环、一次 getattr 与几次判断。生成的
    源码只由列表里的标识符（字段名、物理列名都是代码里写死的常量）拼成，编码函数经默认参数传入，
    不读任何外部输入。语义与 ``params_by_plan`` 逐键相同：值为 None 且 None 有预先算好的编码时取常量；
    多个物理列的按位解包（宽度不对照样 ValueError，与 ``zip(strict=True)`` 同）。
    """
    namespace: dict[str, Any] = {}
    lines: list[str] = []
    entries: list[str] = []
    for index, (field_name, physical, encode, null) in enumerate(plan):
        if not field_name.isidentifier():  # pragma: no cover - 字段名来自 dataclass，总是标识符
            raise AssertionError(f"列 {field_name!r} 不是标识符")
        read = f"record.{field_name}"
        if encode is None:
            entries.append(f"{physical!r}: {read}")
            continue
        namespace[f"_e{index}"] = encode
        if isinstance(physical, str):
            if null is None:
                entries.append(f"{physical!r}: _e{index}({read})[0]")
            else:
                namespace[f"_n{index}"] = null[0]
                entries.append(f"{physical!r}: (_n{index} if (v := {read}) is None else _e{index}(v)[0])")
            continue
        names = [f"c{index}_{i}" for i in range(len(physical))]
        value = f"_e{index}({read})"
        if null is not None:
            namespace[f"_n{index}"] = null
            value = f"(_n{index} if (v := {read}) is None else _e{index}(v))"
        lines.append(f"    {', '.join(names)}, = {value}")
        entries.extend(f"{column!r}: {name}" for column, name in zip(physical, names, strict=True))
    if as_tuple:
        # 按位置的一行（``values``）：同样的取值表达式，去掉键，结果是元组。
        body = "(" + ", ".join(entry.split(": ", 1)[1] for entry in entries) + ",)"
    else:
        body = "{" + ", ".join(entries) + "}"
    source = "def params(record):\n" + "\n".join(lines) + "\n    return " + body + "\n"
    exec(compile(source, "<RowCodec.params>", "exec"), namespace)  # 见上：源码只含常量标识符
    compiled: Callable[[object], Any] = namespace["params"]
    return compiled


# values_since 里照抄上一行编码的条件（按列类型）。身份相同就够的：值本身不可变（str、int、枚举、datetime、
# 冻结的 Progress / Failure）。标签与桶号只有是 frozenset 时才照抄（evolve 不校验，可能塞进一个可变的 set，
# 之后被就地改过）。JSON 值（outcome、payload）与配方（kwargs 是普通 dict）可能在两次调用之间被调用方就地
# 改过：同一个对象不等于同一个值，每次重新编码——它们的可存储性检查（check_json_value）就在编码里，也跟着重做。
_REUSE_IF_SAME: dict[Kind, str | None] = {
    Kind.TEXT: "",
    Kind.INT: "",
    Kind.STATUS: "",
    Kind.ACTION: "",
    Kind.TIMESTAMP: "",
    Kind.PROGRESS: "",
    Kind.FAILURE: "",
    Kind.TAGS: " and v.__class__ is frozenset",
    Kind.BUCKETS: " and v.__class__ is frozenset",
    Kind.JSON: None,
    Kind.RECIPE: None,
}


def _compile_values_like(
    plan: Sequence[tuple[str, str | tuple[str, ...], _Encoder | None, tuple[Any, ...] | None]],
    kinds: Sequence[Kind] | None = None,
) -> Callable[[object, object, Sequence[Any]], tuple[Any, ...]]:
    """编译 ``values_like``：一批同形状的记录（``create_many`` 的十万个任务由同一个模板复制而来）里，
    这一条与上一条是同一个对象的字段，编码照抄上一行的对应位置，不再调用编码函数。

    为什么成立：编码函数是值的纯函数（时间的记忆表也按对象身份查），同一个对象编码出的就是同一组列值；
    字段值不可变（快照、迁移记录都是冻结的），上一行编码之后对象没有变过。为什么值得：批量建任务时除
    task_id 与两个时间外字段全都原样沿用，一行 45 列里十来次编码调用（时间格式化、JSON、枚举取值）就只剩
    变了的那一两次；结果直接是按位置的元组，也省掉中间的字典。原样存的列（整数、不另查的文本）照旧直接取值
    ——比较身份并不比取值便宜。语义与 ``tuple(params(record).values())`` 逐项相同（测试对照）。

    ``kinds``（与计划逐项对应的列类型）给出时编译跨调用的版本（``SnapshotCodec.save_values_since``）：上一条记录来自更早的一次
    调用（存储记着的上一次写），其间调用方可能就地改过可变的值，照抄只限于 ``_REUSE_IF_SAME`` 允许的列。
    """
    namespace: dict[str, Any] = {}
    lines: list[str] = []
    items: list[str] = []
    position = 0
    for index, (field_name, physical, encode, null) in enumerate(plan):
        if not field_name.isidentifier():  # pragma: no cover - 字段名来自 dataclass，总是标识符
            raise AssertionError(f"列 {field_name!r} 不是标识符")
        read = f"record.{field_name}"
        if encode is None:
            items.append(read)
            position += 1
            continue
        namespace[f"_e{index}"] = encode
        width = 1 if isinstance(physical, str) else len(physical)
        names = [f"c{index}_{i}" for i in range(width)]
        targets = ", ".join(names) + ","
        lines.append(f"    v = {read}")
        guard = "" if kinds is None else _REUSE_IF_SAME[kinds[index]]
        if guard is None:
            # 不照抄（见 _REUSE_IF_SAME）：与 params 同样编码。
            if null is not None:
                namespace[f"_n{index}"] = null
                lines.append(f"    {targets} = _n{index} if v is None else _e{index}(v)")
            else:
                lines.append(f"    {targets} = _e{index}(v)")
            items.extend(names)
            position += width
            continue
        if kinds is not None and null is not None:
            # 跨调用的版本先看 None（取常量，与 params 一样便宜）：快照大半列是 None，先比身份反而
            # 多一次属性读。
            namespace[f"_n{index}"] = null
            lines.append("    if v is None:")
            lines.append(f"        {targets} = _n{index}")
            lines.append(f"    elif v is previous.{field_name}{guard}:")
        else:
            lines.append(f"    if v is previous.{field_name}{guard}:")
        lines.append(f"        {targets} = {', '.join(f'row[{position + i}]' for i in range(width))},")
        lines.append("    else:")
        if null is not None:
            namespace[f"_n{index}"] = null
            lines.append(f"        {targets} = _n{index} if v is None else _e{index}(v)")
        else:
            lines.append(f"        {targets} = _e{index}(v)")
        items.extend(names)
        position += width
    source = (
        "def values_like(record, previous, row):\n"
        + "\n".join(lines)
        + "\n    return ("
        + ", ".join(items)
        + ",)\n"
    )
    exec(compile(source, "<RowCodec.values_like>", "exec"), namespace)  # 同 _compile_params：只含常量标识符
    compiled: Callable[[object, object, Sequence[Any]], tuple[Any, ...]] = namespace["values_like"]
    return compiled


class SnapshotCodec(RowCodec):
    """快照表的编解码与派生的列清单。"""

    def __init__(self, dialect: SqlDialect) -> None:
        super().__init__(dialect, TASK_COLUMNS, "快照字段 ")
        self.side_channel: frozenset[str] = frozenset(
            name for c in TASK_COLUMNS if c.side_channel for name in dialect.physical(c)
        )
        """save 从不改写的物理列（旁路字段及其排序键 / 偏移列）：它们只由 create 与 touch 写入。"""
        self.save_columns: tuple[str, ...] = tuple(
            name
            for c in TASK_COLUMNS
            if not c.primary_key and not c.side_channel and not c.create_only
            for name in dialect.physical(c)
        )
        """save 的 UPDATE 写的列：除主键、旁路列与只在 create 时写的列（配方）之外的全部。"""
        saved = {
            c.name for c in TASK_COLUMNS if not c.primary_key and not c.side_channel and not c.create_only
        }
        self._save_plan = [step for step in self._plan if step[0] in saved]
        save_kinds = [c.kind for c in TASK_COLUMNS if c.name in saved]
        trusted_recipe = _trusted_recipe_of(dialect)
        self._trusted_decoders = [
            (name, part, trusted_recipe if name == "recipe" else decode)
            for name, part, decode in self._decoders
        ]
        # 原样取值的列（见 _compile_decoder）只在方言没有改写 decoder 时才直接取：改写了就一律调它的解码。
        plain = type(dialect).decoder is SqlDialect.decoder
        self._trusted_state: Callable[[Sequence[Any]], dict[str, Any]] = _compile_decoder(
            self._trusted_decoders, [c.kind for c in TASK_COLUMNS] if plain else None
        )
        """``trusted_from_row`` 的解码：与逐列 ``{name: decode(row[part])}`` 逐键相同，编译成字典字面量。"""
        self.save_params: Callable[[TaskSnapshot], dict[str, Any]] = _compile_params(self._save_plan)
        """只编码 save 要写的列（``save_columns``）：旁路字段（租约、进度、心跳）与配方 save 从不写，每次 save
        不必再为它们做时间格式化与 JSON 编码。与 ``params`` 一样由计划编译（每次状态迁移一次；解释执行的
        计划每个 save 约 20 µs，编译后是几微秒），语义与 ``save_params_by_plan`` 逐键相同。"""
        self.save_values: Callable[[TaskSnapshot], tuple[Any, ...]] = _compile_params(
            self._save_plan, as_tuple=True
        )
        """按 ``save_columns`` 顺序的一行：与 ``tuple(save_params(快照).values())`` 逐项相同。"""
        self.save_values_since: Callable[[TaskSnapshot, TaskSnapshot, Sequence[Any]], tuple[Any, ...]] = (
            _compile_values_like(self._save_plan, save_kinds)
        )
        """``(快照, 同一任务更早写过的快照, 它的 save_values 行)`` → 这个快照的 save_values 行：
        与上一版是同一个不可变对象的字段照抄编码（``_compile_values_like`` 的跨调用版：JSON 值与可变的
        集合每次重新编码）。一次迁移只改状态、版本与一两个时间，其余列不必再编码。"""
        positions = {name: index for index, name in enumerate(self.names)}
        self.save_from_row: Callable[[Sequence[Any]], tuple[Any, ...]] = itemgetter(
            *(positions[name] for name in self.save_columns)
        )
        """整行（``names`` 顺序，create 写的行）→ 其中 save 写的那些列（``save_values`` 的形状），C 实现的
        一次取值：新任务的第一次 save 拿 create 编好的行作照抄的底本。"""

    def save_params_by_plan(self, snapshot: TaskSnapshot) -> dict[str, Any]:
        """``save_params`` 的解释执行版：编译版的参照，测试用它对照两者逐键相同。"""
        return self._encode(snapshot, self._save_plan)

    def from_row(self, row: Sequence[Any]) -> TaskSnapshot:
        return TaskSnapshot(**self.fields(row))

    def trusted_from_row(self, row: Sequence[Any]) -> TaskSnapshot:
        """认领的热路径（``claim_queued`` 交回的行）：行出自本库的快照表，写入时已逐字段校验过，跳过
        ``TaskSnapshot.__post_init__`` 与配方参数的逐个检查（``Recipe.trusted_from_dict``）。解码器照样把
        状态、时间、标签、进度、失败转成正确的类型（未知状态、配方里的未知字段照样报错）；得到的快照与
        ``from_row`` 逐字段相同（测试对照）。

        为什么：worker 每认领一个任务解码一行，构造时的校验与配方参数的递归检查是解码里的大头（issue 19 的
        吞吐）；与 ``TransitionCodec.trusted_from_row`` 同一个理由。
        """
        state = self._trusted_state(row)
        if not state["tags"]:
            state["tags"] = NO_TAGS  # 与 normalize_tags 一样共用一个空集合（集合都被循环 GC 追踪）
        # status / tags 放进槽、其余的就是实例字典（见 records._SnapshotSlots），不经 frozen 的 __setattr__
        return snapshot_from_state(state)

    def create_table(self, table: str, dialect: SqlDialect | None = None) -> str:
        """``CREATE TABLE IF NOT EXISTS <table> (...)``，列由列表推导（第 1 版之后补的列不在里面，
        见 ``add_later_columns``：已发布的建表语句逐字不变）。

        ``dialect``：写列定义用的方言，默认本编解码器的。PostgreSQL 传一个知道 schema 的方言实例：它把
        状态列写成 schema 里的域类型（类型名要按 schema 限定，而编解码器的方言是全局共用、不知道 schema 的）。
        """
        body = ",\n".join(
            (dialect or self.dialect).column_lines(c for c in self.logical if not c.added_later)
        )
        return f"CREATE TABLE IF NOT EXISTS {table} (\n{body}\n)"

    def add_later_columns(self, table: str, *, if_not_exists: bool) -> list[str]:
        """第 1 版之后补进来的列的 ``ALTER TABLE ... ADD COLUMN``（建表之后、打开旧库时执行）。

        ``if_not_exists``：方言支持 ``ADD COLUMN IF NOT EXISTS``（PostgreSQL）；不支持的（SQLite）由调用方
        先查列在不在。
        """
        guard = " IF NOT EXISTS" if if_not_exists else ""
        return [
            f"ALTER TABLE {table} ADD COLUMN{guard} {' '.join(line.split())}"
            for c in self.logical
            if c.added_later
            for line in self.dialect.column_lines([c])
        ]


def _compile_decoder(
    decoders: Sequence[tuple[str, slice, _Decoder]], kinds: Sequence[Kind] | None
) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """把逐列的解码（``(字段名, 切片, 解码函数)``）编译成一个函数：一个字典字面量，没有逐列的循环。
    原样取值的列（文本、整数：解码就是 ``values[0]``）直接写成 ``row[i]``，不再调一次解码函数、切一次片。

    为什么：认领热路径（worker 每个任务解码一行 36 列）里逐列的字典推导与十来次只做 ``values[0]`` 的函数
    调用是解码本身的大头。生成的源码与 ``_compile_params`` 一样只由代码里写死的字段名拼成。
    ``kinds`` 为 None（方言改写了 ``decoder``）时每列都调它的解码函数。"""
    namespace: dict[str, Any] = {}
    entries: list[str] = []
    for index, (name, part, decode) in enumerate(decoders):
        if not name.isidentifier():  # pragma: no cover - 字段名来自 dataclass，总是标识符
            raise AssertionError(f"列 {name!r} 不是标识符")
        if kinds is not None and kinds[index] in (Kind.TEXT, Kind.INT) and part.stop - part.start == 1:
            entries.append(f"{name!r}: row[{part.start}]")
            continue
        namespace[f"_d{index}"] = decode
        entries.append(f"{name!r}: _d{index}(row[{part.start}:{part.stop}])")
    source = "def decode(row):\n    return {" + ", ".join(entries) + "}\n"
    exec(compile(source, "<SnapshotCodec.trusted_state>", "exec"), namespace)  # 源码只含常量标识符
    compiled: Callable[[Sequence[Any]], dict[str, Any]] = namespace["decode"]
    return compiled


def _trusted_recipe_of(dialect: SqlDialect) -> _Decoder:
    return lambda values: (
        None if values[0] is None else Recipe.trusted_from_dict(dialect.decode_json(values[0]))
    )


class TransitionCodec(RowCodec):
    def __init__(self, dialect: SqlDialect) -> None:
        super().__init__(dialect, TRANSITION_COLUMNS, "迁移记录的 ")

    def from_row(self, row: Sequence[Any]) -> Transition:
        return Transition(**self.fields(row))

    def trusted_from_row(self, row: Sequence[Any]) -> Transition:
        """归档导出的热路径：行出自本库的迁移记录表（写入时已逐字段校验），跳过 ``Transition`` 的构造
        校验。解码器照样把状态、时间转成正确的类型（未知状态照样报错）。"""
        return Transition._trusted(**self.fields(row))


class CommandCodec(RowCodec):
    def __init__(self, dialect: SqlDialect) -> None:
        super().__init__(dialect, COMMAND_COLUMNS, "指令的 ", "指令 ")

    def from_row(self, row: Sequence[Any]) -> Command:
        return Command(**self.fields(row))


class NodeCodec(RowCodec):
    def __init__(self, dialect: SqlDialect) -> None:
        super().__init__(dialect, NODE_COLUMNS, "节点记录的 ", "NodeRecord.")

    def from_row(self, row: Sequence[Any]) -> NodeRecord:
        return NodeRecord(**self.fields(row))


__all__ = [
    "CommandCodec",
    "NodeCodec",
    "RowCodec",
    "SnapshotCodec",
    "SqlDialect",
    "TransitionCodec",
    "escape_like",
]
