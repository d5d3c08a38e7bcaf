// Speech to text on the chat page: an audio file (wav, flac, mp3) or a recording from the
// microphone, sent to /v1/audio/transcriptions (or /translations); the transcript is shown as
// text with its timed segments, and can be put into the message box.
"use strict";

(function () {
  const { apiFetch, errorText, el } = window.ort;
  const $ = (id) => document.getElementById(id);
  let recording = null;          // { ctx, source, node, stream, chunks, rate }

  function status(text) {
    $("speech-status").textContent = text;
  }

  function clock(seconds) {
    const m = Math.floor(seconds / 60);
    return m + ":" + (seconds - 60 * m).toFixed(2).padStart(5, "0");
  }

  function busy(on) {
    $("speech-go").disabled = on;
    $("speech-record").disabled = on && !recording;
  }

  async function transcribe(blob, name) {
    const form = new FormData();
    form.append("file", blob, name);
    form.append("response_format", "verbose_json");
    const route = $("speech-translate").checked ? "translations" : "transcriptions";
    status((route === "translations" ? "Translating " : "Transcribing ") + name + "\u2026");
    busy(true);
    const t0 = performance.now();
    try {
      const res = await apiFetch("/v1/audio/" + route, { method: "POST", body: form });
      if (!res.ok) {
        status(await errorText(res));
        return;
      }
      const body = await res.json();
      $("transcript").textContent = body.text;        // as text: never markup
      $("segments").replaceChildren(...(body.segments || []).map((s) => el("li", {},
        el("span", { class: "seg-time", text: clock(s.start) + "\u2013" + clock(s.end) }),
        el("span", { class: "seg-text", text: s.text.trim() }))));
      $("use-transcript").hidden = !body.text;
      const spent = (performance.now() - t0) / 1000;
      status(body.duration.toFixed(1) + " s of audio" + (body.language ? " (" + body.language + ")" : "") +
             " in " + spent.toFixed(1) + " s" + (body.text ? "" : ": no speech found"));
    } catch (e) {
      status("The transcription failed: " + e.message);
    } finally {
      busy(false);
    }
  }

  function fromFile(e) {
    e.preventDefault();
    const file = $("speech-file").files[0];
    if (!file) {
      status("Choose an audio file (wav, flac or mp3) first.");
      $("speech-file").focus();
      return;
    }
    transcribe(file, file.name);
  }

  // 16-bit PCM WAV of the recorded samples (the server takes wav, flac or mp3; a browser's own
  // recorder writes webm or ogg, so the samples are taken raw and written here).
  function wavBlob(chunks, rate) {
    const n = chunks.reduce((a, c) => a + c.length, 0);
    const view = new DataView(new ArrayBuffer(44 + 2 * n));
    const text = (at, s) => { for (let i = 0; i < s.length; i++) view.setUint8(at + i, s.charCodeAt(i)); };
    text(0, "RIFF"); view.setUint32(4, 36 + 2 * n, true); text(8, "WAVE"); text(12, "fmt ");
    view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
    view.setUint32(24, rate, true); view.setUint32(28, 2 * rate, true); view.setUint16(32, 2, true);
    view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, 2 * n, true);
    let at = 44;
    for (const c of chunks) {
      for (const x of c) {
        view.setInt16(at, Math.round(Math.max(-1, Math.min(1, x)) * 32767), true);
        at += 2;
      }
    }
    return new Blob([view.buffer], { type: "audio/wav" });
  }

  async function startRecording() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      status("This browser cannot record from this page (recording needs localhost or https).");
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (e) {
      status("No microphone: " + e.message);
      return;
    }
    const ctx = new AudioContext();
    const source = ctx.createMediaStreamSource(stream);
    const node = ctx.createScriptProcessor(4096, 1, 1);
    const chunks = [];
    node.onaudioprocess = (e) => chunks.push(new Float32Array(e.inputBuffer.getChannelData(0)));
    source.connect(node);
    node.connect(ctx.destination);
    recording = { ctx, source, node, stream, chunks, rate: ctx.sampleRate };
    $("speech-record").textContent = "Stop and transcribe";
    $("speech-record").setAttribute("aria-pressed", "true");
    status("Recording\u2026");
  }

  async function stopRecording() {
    const r = recording;
    recording = null;
    r.node.disconnect();
    r.source.disconnect();
    r.stream.getTracks().forEach((t) => t.stop());
    await r.ctx.close();
    $("speech-record").textContent = "Record";
    $("speech-record").setAttribute("aria-pressed", "false");
    await transcribe(wavBlob(r.chunks, r.rate), "recording.wav");
  }

  function recordedSeconds() {
    return recording ? recording.chunks.reduce((a, c) => a + c.length, 0) / recording.rate : 0;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("speech-form").addEventListener("submit", fromFile);
    $("speech-record").addEventListener("click", () => (recording ? stopRecording() : startRecording()));
    $("use-transcript").addEventListener("click", () => {
      const prompt = $("prompt");
      prompt.value = (prompt.value ? prompt.value + "\n" : "") + $("transcript").textContent;
      prompt.focus();
    });
  });
  window.ortSpeech = { transcribe, recordedSeconds };
})();
