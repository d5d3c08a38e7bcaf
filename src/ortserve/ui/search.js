// Document search on the chat page: pick a vector store, search it, show the hits (as text),
// and the chat option "answer from store" (the `file_search` field of /v1/chat/completions).
"use strict";

(function () {
  const { apiFetch, errorText, el } = window.ort;
  const PREFS = "ortserve.documents";
  const $ = (id) => document.getElementById(id);

  function status(text) {
    $("search-status").textContent = text;
  }

  function savePrefs() {
    localStorage.setItem(PREFS, JSON.stringify({ store: $("store").value, use: $("use-store").checked }));
    $("use-store").disabled = !$("store").value;
  }

  function storeLabel(s) {
    const files = s.file_counts ? s.file_counts.completed : 0;
    return (s.name || s.id) + " (" + files + (files === 1 ? " file)" : " files)");
  }

  async function loadStores() {
    const res = await apiFetch("/v1/vector_stores?limit=100");
    if (!res.ok) {
      status("Stores: " + (await errorText(res)));
      return;
    }
    const stores = (await res.json()).data || [];
    let prefs = {};
    try { prefs = JSON.parse(localStorage.getItem(PREFS)) || {}; } catch (e) { /* none kept */ }
    const select = $("store");
    const first = el("option", { value: "", text: stores.length ? "Choose a store" : "No stores yet" });
    select.replaceChildren(first, ...stores.map((s) => el("option", { value: s.id, text: storeLabel(s) })));
    if (stores.some((s) => s.id === prefs.store)) select.value = prefs.store;
    $("use-store").checked = Boolean(prefs.use && select.value);
    $("use-store").disabled = !select.value;
    status(stores.length ? "" : "Create a store with the API or `ortserve rag ingest` (see docs/rag.md).");
  }

  function hitNode(h) {
    const text = (h.content || []).map((c) => c.text || "").join("\n");
    const score = typeof h.score === "number" ? "score " + h.score.toFixed(3) : "";
    return el("li", { class: "hit" },
      el("div", { class: "hit-head" }, el("strong", { class: "hit-file", text: h.filename || h.file_id }),
        el("span", { class: "hit-score", text: score })),
      el("p", { class: "hit-text", text }));  // as text: a document cannot put markup in the page
  }

  async function search(e) {
    e.preventDefault();
    const id = $("store").value;
    const query = $("search-query").value.trim();
    if (!id) {
      status("Choose a store first.");
      $("store").focus();
      return;
    }
    if (!query) return;
    status("Searching\u2026");
    const res = await apiFetch("/v1/vector_stores/" + encodeURIComponent(id) + "/search", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ query, max_num_results: 5 }) });
    if (!res.ok) {
      status(await errorText(res));
      return;
    }
    const hits = (await res.json()).data || [];
    $("hits").replaceChildren(...hits.map(hitNode));
    status(hits.length ? hits.length + (hits.length === 1 ? " hit" : " hits") : "No hits.");
  }

  // The chat's `file_search` field, or null when "answer from store" is off.
  function fileSearch() {
    const id = $("store").value;
    return $("use-store").checked && id ? { vector_store_ids: [id], max_num_results: 4 } : null;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("search-form").addEventListener("submit", search);
    $("store").addEventListener("change", savePrefs);
    $("use-store").addEventListener("change", savePrefs);
    $("documents").addEventListener("toggle", () => { if ($("documents").open) loadStores(); });
    loadStores();
  });
  window.ortSearch = { loadStores, fileSearch };
})();
