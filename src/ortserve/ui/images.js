// Images in the chat box (docs/vision.md): attach (the Image button) or paste a PNG, JPEG, WebP or
// GIF while a vision model is selected (kind "vision" in /v1/models); each is kept as a data URL,
// shown as a thumbnail, and sent with the next message as an OpenAI image_url part. The server
// checks them (bytes, pixels, count); its 400 shows in the answer, as every refusal does.
"use strict";

(function () {
  const { el } = window.ort;
  const $ = (id) => document.getElementById(id);
  const TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
  const MAX_BYTES = 20 * 1024 * 1024;  // the server's default image_max_bytes
  let kinds = {};    // model id -> kind, from chat.js's /v1/models
  let pending = [];  // [{ url, name }] until Send

  const vision = () => kinds[$("model").value] === "vision";
  const say = (text) => { $("status").textContent = text; };

  function models(list) {
    kinds = Object.fromEntries(list.map((m) => [m.id, m.kind]));
    refresh();
  }

  function refresh() {
    $("attach").hidden = !vision() && !pending.length;
    $("attached").replaceChildren(...pending.map((p, i) => el("span", { class: "thumb" },
      el("img", { src: p.url, alt: p.name }),
      el("button", { type: "button", class: "unattach", "aria-label": "Remove " + p.name, text: "\u00D7",
                     onclick: () => { pending.splice(i, 1); refresh(); } }))));
  }

  function add(files) {
    for (const f of files) {
      if (!TYPES.includes(f.type)) { say(f.name + " is not a PNG, JPEG, WebP or GIF image."); continue; }
      if (!vision()) { say($("model").value + " reads text only: choose a vision model to send images."); return; }
      if (f.size > MAX_BYTES) { say(f.name + " is over 20 MiB."); continue; }
      const reader = new FileReader();
      reader.onload = () => { pending.push({ url: reader.result, name: f.name || "pasted image" }); refresh(); };
      reader.readAsDataURL(f);
    }
  }

  // The images for the message being sent (and none left attached).
  function take() {
    const out = pending.map((p) => p.url);
    pending = [];
    refresh();
    return out.length ? out : undefined;
  }

  // A user message with images as OpenAI content parts.
  function parts(m) {
    return [{ type: "text", text: m.content },
            ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))];
  }

  function thumbs(images) {
    return el("div", { class: "thumbs" }, ...images.map((url, i) => el("img", { src: url, alt: "image " + (i + 1) })));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("attach").addEventListener("click", () => $("image-file").click());
    $("image-file").addEventListener("change", (e) => { add(e.target.files); e.target.value = ""; });
    $("prompt").addEventListener("paste", (e) => {
      const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) { e.preventDefault(); add(files); }
    });
    $("model").addEventListener("change", refresh);
  });
  window.ortImages = { models, take, parts, thumbs, pending: () => pending.length };
})();
