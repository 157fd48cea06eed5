/* Sortable, filterable, paginated tables for the book, offline and without any library.
 *
 * - table.kvbook-interactive (analysis/tables.py: a long or wide table of a chapter): a filter box,
 *   sortable headers (numeric cells sort by their data-sort value) and pages of data-page-size rows.
 * - any other table of a cell's output with more than 20 rows (a chapter's parameters table): the same.
 * - table.kvbook-ledger (book/claims.md, a list-table with :class: kvbook-ledger): the same, and the
 *   column headed "Verdict" becomes a coloured badge (+ "fragile" / "amended" marks, and a sortable
 *   "Robustness" column), while the verdict's text and the column headed "Rule" move into a details
 *   row that a "rule" button opens.
 * - table.kvbook-answers (the front page, a list-table with :class: kvbook-answers): every glued verdict
 *   (span.pasted-text) in the column headed "Verdict" gets the ledger's badge and marks, its full text in
 *   a "details" disclosure; no sorting or paging (glue from another page is text, so the badge is made here).
 * Without JavaScript every table is the full plain table.
 */
(function () {
  "use strict";
  var LABELS = ["not reproduced", "partly reproduced", "not testable", "reproduced", "consistent"];

  function text(el) { return (el.textContent || "").replace(/\s+/g, " ").trim(); }
  function slug(s) { return s.replace(/[^a-z]+/gi, "-").toLowerCase(); }

  function verdictOf(s) {
    var t = s.toLowerCase(), label = "", settings = [];
    for (var i = 0; i < LABELS.length; i++) {
      if (t.indexOf(LABELS[i]) === 0) { label = LABELS[i]; break; }
    }
    var m = t.match(/^[^;]*?\((fragile|robust)\b/);
    var robustness = m ? m[1] : "—";
    if (!label) {
      // one verdict per setting ("conversation: not reproduced (...); synthetic: not reproduced (...)"): a
      // label per setting, read outside the parentheses; the row's label is the first setting's
      var flat = t;
      while (/\([^()]*\)/.test(flat)) { flat = flat.replace(/\([^()]*\)/g, ""); }
      var re = new RegExp("(?:^|;)\\s*([^:;]{1,40}?):\\s*(" + LABELS.join("|") + ")\\b", "g"), p;
      while ((p = re.exec(flat)) !== null) { settings.push({setting: p[1].trim(), label: p[2]}); }
      if (settings.length) {
        label = settings[0].label;
        robustness = /\(fragile\b/.test(t) ? "fragile" : (/\(robust\b/.test(t) ? "robust" : "—");
      }
    }
    if (!label) { label = t.split(/[.;(]/)[0].trim() || "—"; }
    return {label: label, robustness: robustness, amended: /amended after the result/.test(t),
            settings: settings};
  }

  function labelBadges(el, v) {  // one badge for the verdict, or one per setting ("conversation: ...")
    if (v.settings.length > 1 || (v.settings.length === 1 && v.settings[0].setting)) {
      v.settings.forEach(function (x) {
        el.appendChild(badge("kv-verdict-" + slug(x.label), x.setting + ": " + x.label));
      });
    } else {
      el.appendChild(badge("kv-verdict-" + slug(v.label), v.label));
    }
  }

  function badge(cls, label) {
    var b = document.createElement("span");
    b.className = "kv-badge " + cls;
    b.textContent = label;
    return b;
  }

  function setup(table) {
    if (table.dataset.kvbookReady) { return; }
    table.dataset.kvbookReady = "1";
    var ledger = table.classList.contains("kvbook-ledger");
    var head = table.tHead && table.tHead.rows[0];
    var body = table.tBodies[0];
    if (!head || !body) { return; }
    var names = Array.prototype.map.call(head.cells, function (c) { return text(c).toLowerCase(); });
    var ruleCol = ledger ? names.findIndex(function (n) { return n.indexOf("rule") === 0; }) : -1;
    var verdictCol = ledger ? names.findIndex(function (n) { return n.indexOf("verdict") === 0; }) : -1;
    var rows = Array.prototype.map.call(body.rows, function (tr, i) {
      return {tr: tr, index: i, detail: null, search: text(tr).toLowerCase()};
    });

    if (ledger && verdictCol >= 0) {
      var ruleCell = ruleCol;  // its index in a body row, before the robustness cell is inserted
      var robTh = document.createElement("th");
      robTh.textContent = "Robustness";
      head.insertBefore(robTh, head.cells[verdictCol + 1] || null);
      if (ruleCol > verdictCol) { ruleCol += 1; }
      rows.forEach(function (r) {
        var cell = r.tr.cells[verdictCol];
        var full = text(cell), v = verdictOf(full);
        var detail = document.createElement("tr");
        detail.className = "kvbook-detail";
        detail.hidden = true;
        var td = document.createElement("td");
        td.colSpan = head.cells.length - (ruleCol >= 0 ? 1 : 0);
        var vp = document.createElement("div");
        vp.innerHTML = "<strong>Verdict:</strong> ";
        while (cell.firstChild) { vp.appendChild(cell.firstChild); }
        td.appendChild(vp);
        if (ruleCell >= 0) {
          var rc = r.tr.cells[ruleCell];
          var rp = document.createElement("div");
          rp.innerHTML = "<strong>Rule:</strong> ";
          while (rc.firstChild) { rp.appendChild(rc.firstChild); }
          td.appendChild(rp);
          rc.classList.add("kvbook-hidden-col");
        }
        detail.appendChild(td);
        labelBadges(cell, v);
        if (v.amended) { cell.appendChild(badge("kv-mark kv-mark-amended", "amended")); }
        var btn = document.createElement("button");
        btn.type = "button";
        btn.className = "kvbook-expand";
        btn.textContent = "rule ▸";
        btn.setAttribute("aria-expanded", "false");
        btn.addEventListener("click", function () {
          detail.hidden = !detail.hidden;
          btn.setAttribute("aria-expanded", String(!detail.hidden));
          btn.textContent = detail.hidden ? "rule ▸" : "rule ▾";
        });
        cell.appendChild(btn);
        cell.dataset.sort = v.label;
        var rob = document.createElement("td");
        rob.dataset.sort = v.robustness;
        if (v.robustness === "fragile") { rob.appendChild(badge("kv-mark kv-mark-fragile", "fragile")); }
        else { rob.textContent = v.robustness; }
        r.tr.insertBefore(rob, r.tr.cells[verdictCol + 1] || null);
        r.detail = detail;
        r.tr.dataset.verdict = v.label;
        r.tr.dataset.robustness = v.robustness;
        if (v.amended) { r.tr.dataset.amended = "1"; }
      });
      if (ruleCol >= 0) { head.cells[ruleCol].classList.add("kvbook-hidden-col"); }
      var cg = table.querySelector("colgroup");
      if (cg) { cg.parentNode.removeChild(cg); }  // the list-table's widths no longer match
    }

    var pageSize = parseInt(table.dataset.pageSize || "10", 10) || 10;
    var state = {query: "", sortCol: -1, dir: 1, page: 0, size: pageSize};
    var bar = document.createElement("div");
    bar.className = "kvbook-table-bar";
    var filter = document.createElement("input");
    filter.type = "search";
    filter.className = "kvbook-filter";
    filter.placeholder = "Filter rows…";
    filter.setAttribute("aria-label", "Filter the table's rows");
    var count = document.createElement("span");
    count.className = "kvbook-count";
    var prev = document.createElement("button"), next = document.createElement("button");
    prev.type = next.type = "button";
    prev.className = "kvbook-prev"; next.className = "kvbook-next";
    prev.textContent = "‹ previous"; next.textContent = "next ›";
    var size = document.createElement("select");
    size.className = "kvbook-size";
    size.setAttribute("aria-label", "Rows per page");
    [pageSize, 25, 50, 0].filter(function (v, i, a) { return a.indexOf(v) === i; }).forEach(function (v) {
      var o = document.createElement("option");
      o.value = String(v);
      o.textContent = v ? v + " rows" : "all rows";
      size.appendChild(o);
    });
    bar.appendChild(filter); bar.appendChild(count); bar.appendChild(prev); bar.appendChild(next);
    bar.appendChild(size);
    var wrap = table.closest(".kvbook-table-wrap, .pst-scrollable-table-container") || table;
    wrap.parentNode.insertBefore(bar, wrap);
    table.kvbookControls = {filter: filter, prev: prev, next: next, size: size, count: count};

    function key(r, col) {
      var c = r.tr.cells[col];
      if (!c) { return ""; }
      var s = c.dataset.sort;
      if (s !== undefined && s !== "" && !isNaN(Number(s))) { return Number(s); }
      return (s !== undefined ? s : text(c)).toLowerCase();
    }

    function render() {
      var shown = rows.filter(function (r) {
        return !state.query || r.search.indexOf(state.query) >= 0;
      });
      if (state.sortCol >= 0) {
        shown.sort(function (a, b) {
          var x = key(a, state.sortCol), y = key(b, state.sortCol), c;
          if (typeof x === "number" && typeof y === "number") { c = x - y; }
          else if (typeof x === "number") { c = -1; }
          else if (typeof y === "number") { c = 1; }
          else { c = String(x).localeCompare(String(y), undefined, {numeric: true}); }
          return c * state.dir || a.index - b.index;
        });
      } else {
        shown.sort(function (a, b) { return a.index - b.index; });
      }
      var per = state.size || shown.length || 1;
      var pages = Math.max(1, Math.ceil(shown.length / per));
      state.page = Math.min(state.page, pages - 1);
      var lo = state.page * per, hi = lo + per;
      rows.forEach(function (r) {
        r.tr.hidden = true;
        if (r.tr.parentNode) { body.removeChild(r.tr); }
        if (r.detail && r.detail.parentNode) { body.removeChild(r.detail); }
      });
      shown.forEach(function (r, i) {
        body.appendChild(r.tr);
        if (r.detail) { body.appendChild(r.detail); }
        r.tr.hidden = i < lo || i >= hi;
        if (r.detail && r.tr.hidden) { r.detail.style.display = "none"; }
        else if (r.detail) { r.detail.style.display = ""; }
      });
      rows.forEach(function (r) {  // filtered-out rows stay in the table, hidden (the page keeps every row)
        if (!r.tr.parentNode) {
          body.appendChild(r.tr);
          if (r.detail) { body.appendChild(r.detail); r.detail.style.display = "none"; }
        }
      });
      count.textContent = shown.length === rows.length
        ? rows.length + " rows" + (pages > 1 ? ", page " + (state.page + 1) + " of " + pages : "")
        : shown.length + " of " + rows.length + " rows" +
          (pages > 1 ? ", page " + (state.page + 1) + " of " + pages : "");
      prev.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
      table.dataset.shownRows = String(shown.filter(function (r) { return !r.tr.hidden; }).length);
      table.dataset.matchingRows = String(shown.length);
    }

    Array.prototype.forEach.call(head.cells, function (th, col) {
      if (th.classList.contains("kvbook-hidden-col")) { return; }
      th.classList.add("kvbook-sortable");
      th.tabIndex = 0;
      th.setAttribute("aria-sort", "none");
      function sort() {
        state.dir = state.sortCol === col ? -state.dir : 1;
        state.sortCol = col;
        state.page = 0;
        Array.prototype.forEach.call(head.cells, function (h) { h.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
        render();
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    });
    filter.addEventListener("input", function () { state.query = filter.value.trim().toLowerCase(); state.page = 0; render(); });
    prev.addEventListener("click", function () { state.page -= 1; render(); });
    next.addEventListener("click", function () { state.page += 1; render(); });
    size.addEventListener("change", function () { state.size = parseInt(size.value, 10); state.page = 0; render(); });
    render();
  }

  function verdictMarks(v) {
    var wrap = document.createElement("span");
    wrap.className = "kv-verdict";
    labelBadges(wrap, v);
    if (v.robustness === "fragile") { wrap.appendChild(badge("kv-mark kv-mark-fragile", "fragile")); }
    if (v.amended) { wrap.appendChild(badge("kv-mark kv-mark-amended", "amended")); }
    return wrap;
  }

  function answers(table) {
    if (table.dataset.kvbookReady) { return; }
    table.dataset.kvbookReady = "1";
    var head = table.tHead && table.tHead.rows[0];
    var body = table.tBodies[0];
    if (!head || !body) { return; }
    var col = Array.prototype.findIndex.call(head.cells, function (c) {
      return text(c).toLowerCase().indexOf("verdict") === 0;
    });
    if (col < 0) { return; }
    Array.prototype.forEach.call(body.rows, function (tr) {
      var cell = tr.cells[col];
      if (!cell) { return; }
      var labels = [];
      cell.querySelectorAll(".pasted-text").forEach(function (span) {
        var v = verdictOf(text(span));
        labels.push(v.label);
        var details = document.createElement("details");
        details.className = "kv-verdict-details";
        var summary = document.createElement("summary");
        summary.textContent = "details";
        details.appendChild(summary);
        span.parentNode.insertBefore(verdictMarks(v), span);
        span.parentNode.insertBefore(details, span);
        details.appendChild(span);
      });
      tr.dataset.verdicts = labels.join("|");
    });
  }

  var MAX_PLAIN_ROWS = 20;  // analysis.tables.MAX_PLAIN_ROWS: a longer table of a cell's output is paginated

  function init() {
    // a cell's other long tables too (a chapter's parameters table, printed as Markdown)
    document.querySelectorAll(".cell_output table").forEach(function (t) {
      if (t.tBodies[0] && t.tBodies[0].rows.length > MAX_PLAIN_ROWS) { t.classList.add("kvbook-interactive"); }
    });
    document.querySelectorAll("table.kvbook-interactive, table.kvbook-ledger").forEach(setup);
    document.querySelectorAll("table.kvbook-answers").forEach(answers);
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); }
  else { init(); }
})();
