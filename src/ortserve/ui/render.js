// Model output -> safe HTML. Raw HTML in the output is shown as text (escaped), images are
// shown as links (never loaded), and DOMPurify cleans what Markdown produced. The page's CSP
// (no inline script) is a last line behind both.
"use strict";

(function () {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

  const md = new marked.Marked({ gfm: true, breaks: false });
  md.use({
    renderer: {
      html(token) {
        return escapeHtml(token.text);
      },
      image(token) {
        const label = token.text || token.title || "image";
        return "[" + escapeHtml(label) + "](" + escapeHtml(token.href || "") + ")";
      },
      code(token) {
        const lang = (token.lang || "").trim().split(/\s+/)[0];
        const known = lang && hljs.getLanguage(lang);
        const body = known ? hljs.highlight(token.text, { language: lang, ignoreIllegals: true }).value
          : escapeHtml(token.text);
        const cls = known ? "hljs language-" + escapeHtml(lang) : "hljs";
        return '<pre><code class="' + cls + '">' + body + "</code></pre>\n";
      },
    },
  });

  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "img", "video", "audio"],
    FORBID_ATTR: ["style"],
  };

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });

  function markdown(text) {
    return DOMPurify.sanitize(md.parse(text || ""), PURIFY);
  }

  window.ortRender = { markdown, escapeHtml };
})();
