// chongming-task 运维控制台：用服务器推送（SSE）原地更新页面。手写、无依赖、无构建步骤、可离线。
// 安全：只用 textContent / DOM API 写入数据，从不 innerHTML——任务名、原因、失败信息都不可信。
"use strict";

(function () {
  var main = document.getElementById("main");
  var live = document.getElementById("live-state");
  if (!main) { return; }
  var url = main.getAttribute("data-stream");
  var view = main.getAttribute("data-view");
  if (!url || !window.EventSource) { return; }

  function setLive(state, text) {
    if (!live) { return; }
    live.setAttribute("data-state", state);
    live.textContent = text;
  }

  function lookup(obj, path) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length; i++) {
      if (obj === null || obj === undefined) { return null; }
      obj = obj[parts[i]];
    }
    return obj;
  }

  // scope 里所有 data-field 元素 ← row 里同名字段；status 徽章顺便换样式类。
  function fill(scope, row) {
    var nodes = scope.querySelectorAll("[data-field]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var field = el.getAttribute("data-field");
      var value = lookup(row, field);
      var badge = field === "pending.label" || field === "claim_label";
      if (badge) {
        el.hidden = !value;
      }
      var text = (value === null || value === undefined) ? (badge || field === "failure" ? "" : "-") : String(value);
      if (el.textContent !== text) { el.textContent = text; }
      if (field === "status_label" && row.status) {
        el.className = "status status-" + row.status;
        el.setAttribute("data-status", row.status);
      }
    }
    var bars = scope.querySelectorAll("progress[data-progress]");
    for (var j = 0; j < bars.length; j++) {
      var p = row.progress || {};
      if (p.total) {
        bars[j].max = p.total;
        bars[j].value = p.done;
      } else if (p.done === null || p.done === undefined) {
        bars[j].max = 1;
        bars[j].value = 0;
      } else {
        bars[j].removeAttribute("value");  // 总数未知：不定进度条
      }
    }
  }

  function updateTasks(data) {
    var rows = document.querySelectorAll("tr[data-task-id]");
    var byId = {};
    for (var i = 0; i < data.tasks.length; i++) { byId[data.tasks[i].task_id] = data.tasks[i]; }
    var changed = rows.length !== data.tasks.length;
    for (var k = 0; k < rows.length; k++) {
      var row = byId[rows[k].getAttribute("data-task-id")];
      if (row) { fill(rows[k], row); } else { changed = true; }
    }
    var notice = document.getElementById("list-changed");
    if (notice) { notice.hidden = !changed; }
  }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    tr.appendChild(td);
    return td;
  }

  function updateTask(data) {
    var section = document.getElementById("task");
    if (!section) { return; }
    fill(section, data);
    var box = document.getElementById("failure");
    if (box) { box.hidden = !data.failure; }
    var buttons = section.querySelectorAll("button[data-action]");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].hidden = (data.actions || []).indexOf(buttons[i].getAttribute("data-action")) < 0;
    }
    var body = document.getElementById("history");
    if (body && data.history && body.children.length !== data.history.length) {
      while (body.firstChild) { body.removeChild(body.firstChild); }
      for (var j = 0; j < data.history.length; j++) {
        var h = data.history[j];
        var tr = document.createElement("tr");
        cell(tr, String(h.version));
        cell(tr, h.at);
        cell(tr, h.from_status + " → " + h.to_status + "（" + h.to_label + "）");
        cell(tr, h.trigger, "mono");
        cell(tr, h.actor || "-");
        cell(tr, h.reason || "");
        body.appendChild(tr);
      }
    }
  }

  function updateNodes(nodes) {
    var body = document.getElementById("nodes");
    if (!body || !nodes) { return; }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    if (!nodes.length) {
      var tr = document.createElement("tr");
      cell(tr, "（没有节点登记：没有持有任务的进程在线）", "empty").colSpan = 5;
      body.appendChild(tr);
      return;
    }
    for (var i = 0; i < nodes.length; i++) {
      var n = nodes[i];
      var row = document.createElement("tr");
      cell(row, n.owner);
      cell(row, n.buckets);
      cell(row, String(n.num_buckets));
      cell(row, n.heartbeat);
      cell(row, n.freshness, n.alive ? "ok" : "bad");
      body.appendChild(row);
    }
  }

  function updateOverview(data) {
    fill(main, data);
    updateNodes(data.nodes);
    var rows = document.querySelectorAll("#status-counts tr[data-status]");
    var counts = {};
    for (var i = 0; i < data.statuses.length; i++) { counts[data.statuses[i].status] = data.statuses[i].count; }
    for (var k = 0; k < rows.length; k++) {
      var target = rows[k].querySelector("[data-count]");
      var n = counts[rows[k].getAttribute("data-status")];
      if (target && n !== undefined) { target.textContent = String(n); }
    }
  }

  // 日志尾巴：第二条 SSE（同一个共享轮询器），只带这个连接没见过的行；DOM 里最多留 MAX_LOG_NODES 行。
  var MAX_LOG_NODES = 2000;
  function logLine(list, line) {
    var last = list.lastElementChild;
    if (last && last.hasAttribute("data-attempt") && last.getAttribute("data-attempt") !== String(line.attempt)) {
      var sep = document.createElement("li");
      sep.className = "log-attempt";
      sep.textContent = "— 第 " + line.attempt + " 次尝试 —";
      list.appendChild(sep);
    }
    var li = document.createElement("li");
    li.setAttribute("data-seq", String(line.seq));
    li.setAttribute("data-attempt", String(line.attempt));
    li.className = "log-" + String(line.level).toLowerCase();
    var parts = [["log-at", line.at], ["log-level", line.level], ["log-n", "#" + line.attempt], ["log-msg", line.message]];
    for (var i = 0; i < parts.length; i++) {
      if (i) { li.appendChild(document.createTextNode(" ")); }
      var span = document.createElement("span");
      span.className = parts[i][0];
      span.textContent = String(parts[i][1]);
      li.appendChild(span);
    }
    list.appendChild(li);
  }

  function followLogs(section) {
    var logUrl = section.getAttribute("data-log-stream");
    var list = document.getElementById("log-lines");
    if (!logUrl || !list) { return; }
    list.scrollTop = list.scrollHeight;  // 首屏就停在最新的一行
    var logs = new EventSource(logUrl);
    logs.addEventListener("bye", function () { logs.close(); });
    logs.addEventListener("logs", function (event) {
      var data;
      try { data = JSON.parse(event.data); } catch (e) { return; }
      var stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;  // 在底部才自动滚动
      for (var i = 0; i < data.lines.length; i++) { logLine(list, data.lines[i]); }
      while (list.children.length > MAX_LOG_NODES) { list.removeChild(list.firstChild); }
      var empty = document.getElementById("logs-empty");
      if (empty) { empty.hidden = list.children.length > 0; }
      var gap = document.getElementById("logs-gap");
      if (gap && data.gap) { gap.hidden = false; }
      if (stick) { list.scrollTop = list.scrollHeight; }
    });
  }

  var logSection = document.getElementById("logs");
  if (view === "task" && logSection) { followLogs(logSection); }

  var source = new EventSource(url);
  source.addEventListener("open", function () { setLive("on", "实时：已连接"); });
  source.addEventListener("error", function () { setLive("off", "实时：连接中断，正在重连…"); });
  source.addEventListener("bye", function () { source.close(); setLive("off", "实时：服务器已关闭"); });
  source.addEventListener("update", function (event) {
    var data;
    try { data = JSON.parse(event.data); } catch (e) { return; }
    if (data.error) { setLive("error", "实时：" + data.error); return; }
    setLive("on", "实时：已连接");
    if (view === "tasks") { updateTasks(data); }
    else if (view === "task") { updateTask(data); }
    else if (view === "overview") { updateOverview(data); }
  });
})();
