// Shared by the chat page and the dashboard: API calls with the key, the key prompt, small helpers.
"use strict";

(function () {
  const KEY = "ortserve.apiKey";
  let asking = null;

  function getKey() {
    return localStorage.getItem(KEY) || "";
  }

  function setKey(value) {
    if (value) localStorage.setItem(KEY, value);
    else localStorage.removeItem(KEY);
  }

  // The server asked for a key (401): show the dialog once, resolve when the user saved one.
  function askKey(message) {
    if (asking) return asking;
    const dialog = document.getElementById("key-dialog");
    const input = document.getElementById("key-input");
    document.getElementById("key-message").textContent = message || "This server needs an API key.";
    input.value = "";
    asking = new Promise((resolve) => {
      dialog.addEventListener("close", function onClose() {
        dialog.removeEventListener("close", onClose);
        asking = null;
        if (dialog.returnValue === "save" && input.value.trim()) {
          setKey(input.value.trim());
          resolve(true);
        } else {
          resolve(false);
        }
      });
    });
    dialog.showModal();
    input.focus();
    return asking;
  }

  // fetch with the stored key as a Bearer header; on 401 ask for a key and retry, until the
  // server takes it or the user cancels (then no more asking until the page is reloaded).
  let declined = false;
  async function apiFetch(path, options) {
    const opts = Object.assign({}, options || {});
    for (;;) {
      const headers = Object.assign({}, opts.headers || {});
      const key = getKey();
      if (key) headers["Authorization"] = "Bearer " + key;
      const res = await fetch(path, Object.assign({}, opts, { headers }));
      if (res.status !== 401 || declined) return res;
      const body = await res.clone().json().catch(() => ({}));
      const msg = (body.error && body.error.message) || "This server needs an API key.";
      if (!(await askKey(getKey() ? "The saved key was refused: " + msg : msg))) {
        declined = true;
        return res;
      }
    }
  }

  // The OpenAI error shape, as one line for the user.
  async function errorText(res) {
    const body = await res.json().catch(() => null);
    const err = body && body.error;
    if (!err) return "HTTP " + res.status;
    return err.message + (err.param ? " (param: " + err.param + ")" : "") + " [" + res.status + "]";
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function wireKeyForm() {
    const forget = document.getElementById("forget-key");
    if (forget) forget.addEventListener("click", () => { setKey(""); forget.textContent = "Key forgotten"; });
  }

  document.addEventListener("DOMContentLoaded", wireKeyForm);
  window.ort = { apiFetch, askKey, errorText, getKey, setKey, el };
})();
