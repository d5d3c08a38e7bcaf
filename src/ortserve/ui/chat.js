// The chat page: conversations in localStorage, streaming from /v1/chat/completions, Stop that
// aborts the fetch (the server sees the disconnect and frees the slot).
"use strict";

(function () {
  const { apiFetch, errorText, el } = window.ort;
  const CONVS = "ortserve.conversations";
  const PREFS = "ortserve.settings";
  const $ = (id) => document.getElementById(id);

  const state = { convs: loadJSON(CONVS, []), current: null, controller: null, prefs: loadJSON(PREFS, {}) };

  function loadJSON(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }

  function save() {
    try { localStorage.setItem(CONVS, JSON.stringify(state.convs)); } catch (e) {  // images can fill the quota
      $("status").textContent = "Not saved in this browser: " + e.message;
    }
  }

  function savePrefs() {
    state.prefs = { model: $("model").value, system: $("system").value,
                    temperature: $("temperature").value, max_tokens: $("max-tokens").value };
    localStorage.setItem(PREFS, JSON.stringify(state.prefs));
  }

  function uid() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  function current() {
    return state.convs.find((c) => c.id === state.current) || null;
  }

  function newConversation() {
    const conv = { id: uid(), title: "New chat", created: Date.now(), messages: [] };
    state.convs.unshift(conv);
    state.current = conv.id;
    save();
    renderSidebar();
    renderMessages();
    $("prompt").focus();
    return conv;
  }

  // ---- sidebar ---------------------------------------------------------------------------
  function renderSidebar() {
    const list = $("conversations");
    list.replaceChildren();
    for (const conv of state.convs) {
      const open = el("button", { class: "conv-title", "aria-current": conv.id === state.current ? "true" : null,
                                  onclick: () => select(conv.id), text: conv.title });
      const rename = el("button", { class: "icon-button", title: "Rename", "aria-label": "Rename " + conv.title,
                                    onclick: () => startRename(conv, item) }, "\u270E");
      const del = el("button", { class: "icon-button", title: "Delete", "aria-label": "Delete " + conv.title,
                                 onclick: () => remove(conv.id) }, "\u2715");
      const item = el("li", { class: conv.id === state.current ? "active" : "" }, open, rename, del);
      list.append(item);
    }
  }

  function startRename(conv, item) {
    const input = el("input", { type: "text", value: conv.title, "aria-label": "New name" });
    const done = (keep) => {
      if (keep && input.value.trim()) conv.title = input.value.trim().slice(0, 80);
      save();
      renderSidebar();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); done(true); }
      if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); done(false); }
    });
    input.addEventListener("blur", () => done(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  function remove(id) {
    state.convs = state.convs.filter((c) => c.id !== id);
    if (state.current === id) state.current = state.convs.length ? state.convs[0].id : null;
    save();
    renderSidebar();
    renderMessages();
  }

  function select(id) {
    if (state.controller) return;  // finish or stop the running answer first
    state.current = id;
    renderSidebar();
    renderMessages();
    document.body.classList.remove("sidebar-open");
    $("toggle-sidebar").setAttribute("aria-expanded", "false");
  }

  function exportCurrent() {
    const conv = current();
    if (!conv) return;
    const blob = new Blob([JSON.stringify(conv, null, 2)], { type: "application/json" });
    const a = el("a", { href: URL.createObjectURL(blob),
                        download: "ortserve-" + conv.title.replace(/[^\w.-]+/g, "_").slice(0, 40) + ".json" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  // ---- messages --------------------------------------------------------------------------
  function renderMessages() {
    const box = $("messages");
    box.replaceChildren();
    const conv = current();
    if (!conv || !conv.messages.length) {
      box.append(el("p", { class: "empty", text: "Ask something. Answers stream here." }));
      return;
    }
    for (const m of conv.messages) box.append(messageNode(m));
    box.scrollTop = box.scrollHeight;
  }

  function messageNode(m) {
    const node = el("article", { class: "msg " + m.role, "aria-label": m.role === "user" ? "You" : "Answer" });
    node.append(el("div", { class: "who", text: m.role === "user" ? "You" : (m.model || "Assistant") }));
    const body = el("div", { class: "body" });
    node.append(body);
    node.append(el("div", { class: "extras" }));
    node.append(el("div", { class: "meta" }));
    fillMessage(node, m);
    return node;
  }

  function fillMessage(node, m) {
    const body = node.querySelector(".body");
    if (m.role === "user") body.textContent = m.content;
    else body.innerHTML = window.ortRender.markdown(m.content);
    if (m.role === "user" && m.images) body.append(window.ortImages.thumbs(m.images));  // images.js
    const extras = node.querySelector(".extras");
    extras.replaceChildren();
    for (const call of m.tool_calls || []) extras.append(toolCallNode(call));
    if (m.citations && m.citations.length) extras.append(citationsNode(m.citations));
    if (m.error) extras.append(el("p", { class: "error", role: "alert", text: m.error }));
    node.querySelector(".meta").textContent = metaLine(m.meta);
  }

  function toolCallNode(call) {
    const fn = call.function || {};
    let args = fn.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* partial while streaming */ }
    return el("details", { class: "tool-call" },
      el("summary", { text: "Tool call: " + (fn.name || "?") }),
      el("pre", {}, el("code", { text: args })));
  }

  // Citations from a document store: [{title|filename|file_id, text|quote?, score?}].
  function citationsNode(citations) {
    const list = el("ol", {});
    for (const c of citations) {
      const name = c.title || c.filename || c.file_id || c.source || "source";
      const quote = c.text || c.quote || c.snippet || "";
      const score = typeof c.score === "number" ? el("span", { class: "cite-score", text: " " + c.score.toFixed(2) }) : null;
      list.append(el("li", {}, el("strong", { text: name }), score, quote ? el("q", { text: quote }) : null));
    }
    return el("details", { class: "citations", open: true }, el("summary", { text: "Sources" }), list);
  }

  function metaLine(meta) {
    if (!meta) return "";
    const parts = [];
    if (meta.ttft_ms != null) parts.push("TTFT " + Math.round(meta.ttft_ms) + " ms");
    if (meta.tps != null) parts.push(meta.tps.toFixed(1) + " tok/s");
    if (meta.tokens != null) parts.push(meta.tokens + " tokens");
    if (meta.provider) parts.push("via " + meta.provider);
    if (meta.finish) parts.push("finish: " + meta.finish);
    return parts.join(" \u00B7 ");
  }

  // ---- sending and streaming -------------------------------------------------------------
  function requestBody(conv) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of conv.messages) {
      if (m.role === "user" || (m.role === "assistant" && !m.error)) messages.push({ role: m.role,
        content: m.images ? window.ortImages.parts(m) : m.content });
    }
    messages.pop();  // the empty answer being written
    const body = { model: $("model").value || undefined, messages, stream: true,
                   stream_options: { include_usage: true } };
    const t = parseFloat($("temperature").value);
    if (!Number.isNaN(t)) body.temperature = t;
    const n = parseInt($("max-tokens").value, 10);
    if (!Number.isNaN(n)) body.max_tokens = n;
    const fileSearch = window.ortSearch.fileSearch();  // "answer from store" (search.js)
    if (fileSearch) body.file_search = fileSearch;
    return body;
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    document.body.classList.toggle("busy", busy);
  }

  async function send() {
    const text = $("prompt").value;
    if ((!text.trim() && !window.ortImages.pending()) || state.controller) return;
    const conv = current() || newConversation();
    if (!conv.messages.length) conv.title = text.trim().slice(0, 40) || "Image";
    conv.messages.push({ role: "user", content: text, images: window.ortImages.take() });
    const answer = { role: "assistant", content: "", model: $("model").value, meta: {} };
    conv.messages.push(answer);
    $("prompt").value = "";
    save();
    renderSidebar();
    renderMessages();
    const node = $("messages").lastElementChild;
    state.controller = new AbortController();
    setBusy(true);
    $("status").textContent = "Answering\u2026";
    try {
      await stream(requestBody(conv), answer, node, state.controller.signal);
      $("status").textContent = "";
    } catch (e) {
      if (e.name === "AbortError") {
        answer.meta.finish = "stopped";
        $("status").textContent = "Stopped.";
      } else {
        answer.error = answer.error || String(e.message || e);
        $("status").textContent = "";
      }
    } finally {
      state.controller = null;
      setBusy(false);
      fillMessage(node, answer);
      save();
      $("prompt").focus();
    }
  }

  async function stream(body, answer, node, signal) {
    const t0 = performance.now();
    let tFirst = null;
    let pending = false;
    const paint = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        fillMessage(node, answer);
        const box = $("messages");
        box.scrollTop = box.scrollHeight;
      });
    };
    const res = await apiFetch("/v1/chat/completions", {
      method: "POST", signal, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (!res.ok) {
      answer.error = await errorText(res);
      return;
    }
    const provider = res.headers.get("x-ortserve-provider");
    if (provider) answer.meta.provider = provider;
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let deltas = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) {
            answer.error = chunk.error.message || "the server reported an error";
            continue;
          }
          if (applyChunk(chunk, answer)) {
            deltas += 1;
            if (tFirst === null) {
              tFirst = performance.now();
              answer.meta.ttft_ms = tFirst - t0;
            }
          }
          paint();
        }
      }
    }
    const tokens = answer.meta.tokens != null ? answer.meta.tokens : deltas;
    answer.meta.tokens = tokens;
    const span = (performance.now() - (tFirst || t0)) / 1000;
    if (tokens > 1 && span > 0) answer.meta.tps = (tokens - 1) / span;
  }

  // One chat.completion.chunk into the answer; true when it carried text or a tool call.
  function applyChunk(chunk, answer) {
    if (chunk.usage) answer.meta.tokens = chunk.usage.completion_tokens;
    if (chunk.model) answer.model = chunk.model;
    if (chunk.ortserve && chunk.ortserve.provider) answer.meta.provider = chunk.ortserve.provider;
    if (chunk.citations) answer.citations = chunk.citations;
    let grew = false;
    for (const choice of chunk.choices || []) {
      const d = choice.delta || {};
      if (d.content) {
        answer.content += d.content;
        grew = true;
      }
      if (d.citations) answer.citations = d.citations;
      for (const tc of d.tool_calls || []) {
        answer.tool_calls = answer.tool_calls || [];
        const i = tc.index || 0;
        const slot = answer.tool_calls[i] || (answer.tool_calls[i] = { id: tc.id, type: "function",
                                                                      function: { name: "", arguments: "" } });
        if (tc.id) slot.id = tc.id;
        if (tc.function && tc.function.name) slot.function.name += tc.function.name;
        if (tc.function && tc.function.arguments) slot.function.arguments += tc.function.arguments;
        grew = true;
      }
      if (choice.finish_reason) answer.meta.finish = choice.finish_reason;
    }
    return grew;
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  // ---- models and start-up ---------------------------------------------------------------
  async function loadModels() {
    const select = $("model");
    const res = await apiFetch("/v1/models");
    if (!res.ok) {
      $("status").textContent = "Models: " + (await errorText(res));
      if (res.status === 503) setTimeout(loadModels, 2000);
      return;
    }
    // embedding models (kind "embedding") cannot chat: they serve the document stores only
    const models = ((await res.json()).data || []).filter((m) => m.kind !== "embedding");
    const label = (m) => m.id + (m.loaded === false ? " (loads on first use)" : "");
    select.replaceChildren(...models.map((m) => el("option", { value: m.id, text: label(m) })));
    if (state.prefs.model && models.some((m) => m.id === state.prefs.model)) select.value = state.prefs.model;
    window.ortImages.models(models);  // which models read images (images.js)
    $("status").textContent = "";
  }

  function wire() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && state.controller) {
        e.preventDefault();
        stop();
      }
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", () => { if (!state.controller) newConversation(); });
    $("export").addEventListener("click", exportCurrent);
    $("toggle-sidebar").addEventListener("click", () => {
      const open = document.body.classList.toggle("sidebar-open");
      $("toggle-sidebar").setAttribute("aria-expanded", String(open));
    });
    for (const id of ["model", "system", "temperature", "max-tokens"]) $(id).addEventListener("change", savePrefs);
    if (state.prefs.system) $("system").value = state.prefs.system;
    if (state.prefs.temperature) $("temperature").value = state.prefs.temperature;
    if (state.prefs.max_tokens) $("max-tokens").value = state.prefs.max_tokens;
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire();
    state.current = state.convs.length ? state.convs[0].id : null;
    renderSidebar();
    renderMessages();
    loadModels();
    $("prompt").focus();
  });
  window.ortChat = { state, send, stop };
})();
