/* DEPICT explorer: vanilla JS, no network. Data files are scripts that call DEPICT.data(path, payload). */
"use strict";
(function () {
  const loaded = {};
  const waiting = {};
  const PAGE = 50;
  const state = { index: null, view: null, order: [], page: 0, sort: "", desc: true, metric: "", selected: null, dis: null };
  const $ = (id) => document.getElementById(id);

  window.DEPICT = {
    data(path, payload) {
      loaded[path] = payload;
      (waiting[path] || []).forEach((w) => w.resolve(payload));
      delete waiting[path];
      if (path === "data/index.js") start(payload);
    },
    state,
  };

  function load(path) {
    if (path in loaded) return Promise.resolve(loaded[path]);
    return new Promise((resolve, reject) => {
      const queue = (waiting[path] = waiting[path] || []);
      queue.push({ resolve, reject });
      if (queue.length > 1) return;
      const s = document.createElement("script");
      s.src = path;
      s.onerror = () => { (waiting[path] || []).forEach((w) => w.reject(new Error("cannot load " + path))); delete waiting[path]; };
      document.head.appendChild(s);
    });
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return node;
  }
  const fmt = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(3));
  function bar(kind, v, title) {
    const width = v === null || v === undefined ? 0 : Math.max(0, Math.min(1, v)) * 100;
    return el("span", { class: "cellbar", title: title || "" }, el("span", { class: "bar " + kind }, el("span", { style: "width:" + width.toFixed(1) + "%" })), el("span", { class: "val" }, fmt(v)));
  }
  function option(value, label, selected) { return el("option", { value, selected: selected ? "selected" : null }, label); }

  function start(index) {
    state.index = index;
    $("run-name").textContent = "run " + index.run + " · " + index.views.length + " view(s)";
    const view = $("view");
    index.views.forEach((v, i) => view.appendChild(option(String(i), v.benchmark + " × " + v.backbone + " (" + v.items + ")", i === 0)));
    view.addEventListener("change", () => openView(Number(view.value)));
    const body = $("run-errors-body");
    if (index.errors.length) {
      body.appendChild(el("table", {}, el("tr", {}, el("th", {}, "stage"), el("th", {}, "reason"), el("th", { class: "num" }, "n"), el("th", {}, "example")),
        index.errors.map((e) => el("tr", {}, el("td", {}, e.stage), el("td", {}, e.reason), el("td", { class: "num" }, e.n), el("td", {}, (e.example || "").slice(0, 160))))));
    } else {
      body.textContent = "no errors";
    }
    for (const id of ["sort", "metric", "tag", "template", "errors-only"]) $(id).addEventListener("change", refresh);
    for (const id of ["min", "max", "search"]) $(id).addEventListener("input", refresh);
    $("order").addEventListener("click", () => { state.desc = !state.desc; $("order").textContent = state.desc ? "descending" : "ascending"; refresh(); });
    $("prev").addEventListener("click", () => { if (state.page > 0) { state.page--; renderList(); } });
    $("next").addEventListener("click", () => { if ((state.page + 1) * PAGE < state.order.length) { state.page++; renderList(); } });
    if (index.views.length) openView(0); else $("count").textContent = "this run has no scores";
  }

  function openView(i) {
    const meta = state.index.views[i];
    load("data/" + meta.view + ".js").then((view) => {
      state.view = view;
      state.selected = null;
      const sort = $("sort"), metric = $("metric"), tag = $("tag"), template = $("template");
      [sort, metric, tag, template].forEach((s) => { s.textContent = ""; });
      const first = view.metrics.includes("depict") ? "depict" : view.metrics[0];
      view.metrics.forEach((m) => { sort.appendChild(option("metric:" + m, m, m === first)); metric.appendChild(option(m, m, m === first)); });
      if (view.human) {
        sort.appendChild(option("human", view.human === "human" ? "human score" : "human (correct)"));
        sort.appendChild(option("disagreement", "rank disagreement (metric vs human)"));
      }
      sort.appendChild(option("id", "item id"));
      sort.appendChild(option("errors", "errors"));
      tag.appendChild(option("", "any"));
      view.tags.forEach((t) => tag.appendChild(option(t, t)));
      template.appendChild(option("", "any"));
      view.templates.forEach((t) => template.appendChild(option(t, t)));
      tag.disabled = !view.tags.length;
      template.disabled = !view.templates.length;
      $("detail").textContent = "";
      $("detail").appendChild(el("p", { class: "hint" }, "Pick an item to see its questions, answers and evidence."));
      refresh();
    }).catch(showError);
  }

  function percentRanks(values, rows) {
    const present = rows.filter((r) => values[r] !== null && values[r] !== undefined).sort((a, b) => values[a] - values[b]);
    const out = {};
    let i = 0;
    while (i < present.length) {
      let j = i;
      while (j + 1 < present.length && values[present[j + 1]] === values[present[i]]) j++;
      const rank = present.length > 1 ? (i + j) / 2 / (present.length - 1) : 0.5;
      for (let k = i; k <= j; k++) out[present[k]] = rank;
      i = j + 1;
    }
    return out;
  }

  function refresh() {
    const v = state.view;
    if (!v) return;
    const it = v.items;
    const metric = $("metric").value;
    const scores = it.scores[metric] || [];
    const lo = $("min").value === "" ? null : Number($("min").value);
    const hi = $("max").value === "" ? null : Number($("max").value);
    const tag = $("tag").value, template = $("template").value;
    const search = $("search").value.trim().toLowerCase();
    const errorsOnly = $("errors-only").checked;
    const all = it.id.map((_, i) => i);
    state.dis = null;
    if (v.human) {
      const both = all.filter((i) => scores[i] !== null && it.human[i] !== null);
      const rm = percentRanks(scores, both), rh = percentRanks(it.human, both);
      state.dis = all.map((i) => (i in rm ? Math.abs(rm[i] - rh[i]) : null));
    }
    let rows = all.filter((i) => {
      const s = scores[i];
      if (lo !== null && (s === null || s < lo)) return false;
      if (hi !== null && (s === null || s > hi)) return false;
      if (tag && !(it.tags[i] || []).includes(tag)) return false;
      if (template && it.template[i] !== template) return false;
      if (search && !(it.caption[i] || "").toLowerCase().includes(search)) return false;
      if (errorsOnly && !it.errors[i]) return false;
      return true;
    });
    const key = $("sort").value;
    let value;
    if (key.startsWith("metric:")) { const col = it.scores[key.slice(7)] || []; value = (i) => col[i]; }
    else if (key === "human") value = (i) => it.human[i];
    else if (key === "disagreement") value = (i) => state.dis[i];
    else if (key === "errors") value = (i) => it.errors[i];
    else value = null;
    const sign = state.desc ? -1 : 1;
    rows.sort((a, b) => {
      if (value) {
        const x = value(a), y = value(b);
        if (x === null || x === undefined) return (y === null || y === undefined) ? a - b : 1;  // nulls last
        if (y === null || y === undefined) return -1;
        if (x !== y) return sign * (x - y);
        return a - b;
      }
      return sign * (it.id[a] < it.id[b] ? -1 : it.id[a] > it.id[b] ? 1 : 0);
    });
    state.order = rows;
    state.page = 0;
    state.metric = metric;
    $("count").textContent = rows.length + " of " + it.id.length + " items";
    renderList();
  }

  function renderList() {
    const v = state.view, it = v.items;
    const head = $("list").tHead, body = $("list").tBodies[0];
    head.textContent = "";
    body.textContent = "";
    head.appendChild(el("tr", {}, el("th", {}, ""), el("th", {}, "item"), el("th", {}, "caption"),
      v.human ? el("th", { class: "num" }, v.human === "human" ? "human" : "correct") : null,
      el("th", { class: "num" }, state.metric), v.human ? el("th", { class: "num", title: "|percentile rank of the metric − percentile rank of the human score|" }, "disagree") : null,
      el("th", { class: "num" }, "errors")));
    const scores = it.scores[state.metric] || [];
    for (const i of state.order.slice(state.page * PAGE, (state.page + 1) * PAGE)) {
      const tr = el("tr", { "data-id": it.id[i], class: it.id[i] === state.selected ? "selected" : null },
        el("td", {}, it.thumb[i] ? el("img", { src: it.thumb[i], alt: "", loading: "lazy" }) : "no image"),
        el("td", {}, it.id[i]), el("td", {}, it.caption[i] || ""),
        v.human ? el("td", { class: "num" }, fmt(it.human[i])) : null,
        el("td", { class: "num" }, fmt(scores[i])),
        v.human ? el("td", { class: "num" }, fmt(state.dis[i])) : null,
        el("td", { class: "num" + (it.errors[i] ? " err" : "") }, it.errors[i] || ""));
      tr.addEventListener("click", () => openItem(i));
      body.appendChild(tr);
    }
    const pages = Math.max(1, Math.ceil(state.order.length / PAGE));
    $("page").textContent = "page " + (state.page + 1) + " of " + pages;
    $("prev").disabled = state.page === 0;
    $("next").disabled = state.page + 1 >= pages;
  }

  function openItem(i) {
    const v = state.view, id = v.items.id[i];
    state.selected = id;
    for (const tr of $("list").tBodies[0].rows) tr.classList.toggle("selected", tr.getAttribute("data-id") === id);
    load("data/" + v.view + "/" + Math.floor(i / v.chunk_size) + ".js").then((chunk) => renderItem(chunk[id])).catch(showError);
  }

  function figure(d) {
    if (!d.image) return el("p", { class: "err" }, "image unavailable" + (d.image_error ? ": " + d.image_error : ""));
    const fig = el("div", { class: "figure" }, el("img", { src: d.image, alt: d.caption || "" }));
    const claims = (d.claims || []).filter((c) => (c.boxes || []).length || (c.control_boxes || []).length);
    if (claims.length) {
      const w = claims[0].width || d.width, h = claims[0].height || d.height;
      const ns = "http://www.w3.org/2000/svg";
      const svg = document.createElementNS(ns, "svg");
      svg.setAttribute("viewBox", "0 0 " + w + " " + h);
      svg.setAttribute("preserveAspectRatio", "none");
      for (const c of claims) {
        for (const [cls, boxes] of [["evidence", c.boxes || []], ["control", c.control_boxes || []]]) {
          for (const b of boxes) {
            const r = document.createElementNS(ns, "rect");
            r.setAttribute("class", cls);
            r.setAttribute("x", b[0]); r.setAttribute("y", b[1]);
            r.setAttribute("width", Math.max(0, b[2] - b[0])); r.setAttribute("height", Math.max(0, b[3] - b[1]));
            const t = document.createElementNS(ns, "title");
            t.textContent = cls + " box: " + c.claim;
            r.appendChild(t);
            svg.appendChild(r);
          }
        }
      }
      fig.appendChild(svg);
    }
    return fig;
  }

  function renderItem(d) {
    const box = $("detail");
    box.textContent = "";
    if (!d) { box.appendChild(el("p", { class: "err" }, "no detail for this item")); return; }
    const human = d.human !== null && d.human !== undefined ? "human " + fmt(d.human) : d.correct !== null && d.correct !== undefined ? (d.correct ? "correct caption" : "wrong caption") : null;
    const order = (m) => { const k = state.view.metrics.indexOf(m); return k < 0 ? 1e9 : k; };
    const scores = d.scores.slice().sort((x, y) => order(x.metric) - order(y.metric));
    box.appendChild(el("div", { class: "top" }, figure(d), el("div", { class: "info" },
      el("div", { class: "caption" }, d.caption || ""),
      el("div", { class: "meta" }, [d.id, "group " + d.group, human, d.template ? "template " + d.template : null, (d.tags || []).length ? "tags " + d.tags.join(", ") : null].filter(Boolean).join(" · ")),
      el("h3", {}, "scores"),
      el("div", { class: "scores" }, scores.map((s) => el("div", { class: "score", title: s.note || "" }, el("span", { class: "metric" }, s.metric), bar("score", s.score), s.note ? el("span", { class: "note" }, s.note) : null))))));

    if (d.questions.length) {
      box.appendChild(el("h3", {}, "questions"));
      box.appendChild(el("div", { class: "legend meta" }, el("span", {}, "p_v: yes on the image"), el("span", {}, "p_t: yes from the caption alone"), el("span", {}, "w: commitment |2p_t−1|"), el("span", {}, "a: agreement")));
      const table = el("table", { class: "questions" }, el("tr", {}, el("th", {}, "set"), el("th", {}, "#"), el("th", {}, "question"), el("th", {}, "p_v"), el("th", {}, "p_t"), el("th", {}, "w"), el("th", {}, "a")));
      for (const q of d.questions) {
        const parents = (q.parents || []).filter((p) => p !== "0");
        table.appendChild(el("tr", { class: "question" }, el("td", {}, q.question_set), el("td", {}, q.question_id),
          el("td", {}, q.question, parents.length ? el("div", { class: "parents" }, "depends on " + parents.join(", ")) : null, q.claim_type ? el("div", { class: "parents" }, q.claim_type) : null),
          el("td", {}, bar("pv", q.p_v, "P(yes | image)")), el("td", {}, q.p_t === null ? "" : bar("pt", q.p_t, "P(yes | caption)")),
          el("td", {}, q.commitment === null ? "" : bar("w", q.commitment, "commitment")), el("td", {}, q.agreement === null ? "" : bar("a", q.agreement, "agreement"))));
      }
      box.appendChild(table);
    }

    if ((d.claims || []).length) {
      box.appendChild(el("h3", {}, "evidence (red: evidence boxes, blue dashed: control boxes)"));
      for (const c of d.claims) {
        box.appendChild(el("div", { class: "claim" }, el("strong", {}, c.claim), " ", el("span", { class: "meta" }, [c.claim_type, c.rule, c.groundable === null ? "detection failed" : c.groundable ? "grounded" : "not grounded", c.note].filter(Boolean).join(" · ")), " ", bar("score", c.s, "grounding support s")));
        if (c.views) {
          box.appendChild(el("div", { class: "views" }, Object.entries(c.views).filter(([, src]) => src).map(([name, src]) => el("figure", {}, el("img", { src, alt: name }), el("figcaption", {}, name.replace("_", " ") + (c.deltas && c.deltas["s_" + name] !== undefined ? " s=" + fmt(c.deltas["s_" + name]) : ""))))));
        }
        if (c.deltas) box.appendChild(el("div", { class: "meta" }, ["d_sel", "d_rnd", "d_suff", "d_anchor"].map((k) => k + " " + fmt(c.deltas[k])).join(" · ")));
      }
    }

    if ((d.judge || []).length) {
      box.appendChild(el("h3", {}, "judge"));
      for (const j of d.judge) {
        box.appendChild(el("div", {}, el("strong", {}, j.kind), " ", j.valid ? "score " + fmt(j.score) : el("span", { class: "err" }, "invalid: " + (j.reason || "")), j.judgement ? el("pre", {}, j.judgement) : null, !j.valid && j.raw_text ? el("pre", {}, j.raw_text) : null));
      }
    }

    if ((d.errors || []).length) {
      box.appendChild(el("h3", {}, "errors"));
      box.appendChild(el("ul", { class: "errors" }, d.errors.map((e) => el("li", {}, el("span", { class: "err" }, e.stage + "/" + e.reason), " " + (e.field ? "[" + e.field + "] " : "") + (e.detail || "")))));
    }
  }

  function showError(err) {
    $("detail").textContent = "";
    $("detail").appendChild(el("p", { class: "err" }, String(err && err.message ? err.message : err)));
  }
})();
