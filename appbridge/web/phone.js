// The AppBridge softphone (docs/web.md): one WebRTC call from this browser to an app, routed
// by number exactly like a phone call. Media is DTLS-SRTP (RFC 5763, RFC 5764); the data
// channel "appbridge" carries keypresses and the hang-up, and brings back the end reason.
"use strict";

(() => {
  const GATHER_LIMIT_MS = 3000; // offer whatever candidates were gathered by then
  const POLL_MS = 500; // transcript: the call's timeline, polled while in call
  const METER_MS = 100; // level meters, about 10 updates a second
  const HANGUP_WAIT_MS = 1500; // how long "Hang up" waits for the gateway's "ended"

  const el = (id) => document.getElementById(id);
  const ui = {
    form: el("dial"),
    number: el("number"),
    numbers: el("numbers"),
    app: el("app"),
    call: el("call"),
    hangup: el("hangup"),
    status: el("status"),
    levelIn: el("level-in"),
    levelOut: el("level-out"),
    transcript: el("transcript"),
    remote: el("remote"),
    keys: Array.from(document.querySelectorAll("[data-digit]")),
  };

  let iceServers = [];
  let current = null; // the call in progress, or null

  // ------------------------------------------------------------------ the gateway's API

  const { api, showLevel, SILENT_DBFS } = window.AppBridge;

  async function errorText(res) {
    try {
      const body = await res.json();
      return body.message || body.error || `HTTP ${res.status}`;
    } catch (_) {
      return `HTTP ${res.status}`;
    }
  }

  async function loadDirectory() {
    const res = await api("/v1/webrtc/directory");
    if (!res.ok) {
      setStatus(`error: ${await errorText(res)}`);
      return;
    }
    const dir = await res.json();
    iceServers = Array.isArray(dir.iceServers) ? dir.iceServers : [];
    const numbers = Array.isArray(dir.numbers) ? dir.numbers : [];
    for (const entry of numbers) {
      const option = document.createElement("option");
      option.value = String(entry.number);
      option.label = String(entry.app);
      ui.numbers.append(option);
    }
    if (!ui.number.value && numbers.length > 0) ui.number.value = String(numbers[0].number);
    const apps = Array.isArray(dir.apps) ? dir.apps : [];
    for (const name of apps) {
      const option = document.createElement("option");
      option.value = String(name);
      option.textContent = String(name);
      ui.app.append(option);
    }
    // No number to dial (only a "*" route, as in the embedded default): call the first app.
    if (numbers.length === 0 && apps.length > 0 && !ui.number.value) ui.app.value = String(apps[0]);
  }

  // ------------------------------------------------------------------ page state

  function setStatus(text) {
    ui.status.textContent = text;
  }

  function setBusy(busy) {
    ui.call.disabled = busy;
    ui.hangup.disabled = !busy;
    ui.number.disabled = busy;
    ui.app.disabled = busy;
  }

  // RMS of the analyser's latest window in dB relative to full scale; -100 for silence.
  function dbfsOf(analyser, samples) {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const s of samples) sum += s * s;
    const rms = Math.sqrt(sum / samples.length);
    return rms > 0 ? Math.max(SILENT_DBFS, 20 * Math.log10(rms)) : SILENT_DBFS;
  }

  function analyserFor(call, stream) {
    const analyser = call.audio.createAnalyser();
    analyser.fftSize = 2048;
    call.audio.createMediaStreamSource(stream).connect(analyser);
    return { analyser, samples: new Float32Array(analyser.fftSize) };
  }

  function updateMeters(call) {
    if (call.micLevel) showLevel(ui.levelIn, dbfsOf(call.micLevel.analyser, call.micLevel.samples));
    if (call.outLevel) showLevel(ui.levelOut, dbfsOf(call.outLevel.analyser, call.outLevel.samples));
  }

  // ------------------------------------------------------------------ one call

  function newCall(target) {
    return {
      target,
      pc: null,
      channel: null,
      pending: [], // control messages sent before the channel opened
      mic: null,
      audio: new AudioContext(), // made here, in the click, so autoplay rules allow it
      micLevel: null,
      outLevel: null,
      remoteStream: null,
      ref: null,
      after: null,
      ended: false,
      meterTimer: 0,
      pollTimer: 0,
    };
  }

  function waitForGathering(pc, limitMs) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, limitMs);
      function done() {
        clearTimeout(timer);
        pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      }
      function check() {
        if (pc.iceGatheringState === "complete") done();
      }
      pc.addEventListener("icegatheringstatechange", check);
    });
  }

  function sendControl(call, message) {
    const text = JSON.stringify(message);
    if (call.channel && call.channel.readyState === "open") call.channel.send(text);
    else call.pending.push(text);
  }

  function onChannelOpen(call) {
    for (const text of call.pending.splice(0)) call.channel.send(text);
  }

  function onChannelMessage(call, event) {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (_) {
      return; // not ours to understand
    }
    if (message && message.type === "ended") {
      finish(call, `ended: ${String(message.reason || "unknown")}`);
    }
  }

  function onRemoteTrack(call, event) {
    const stream = event.streams[0] || new MediaStream([event.track]);
    call.remoteStream = stream;
    ui.remote.srcObject = stream; // Chrome feeds WebAudio from a remote stream only while it plays
    ui.remote.play().catch(() => {});
    call.outLevel = analyserFor(call, stream);
  }

  function onConnectionState(call) {
    if (call.ended) return;
    const state = call.pc.connectionState;
    if (state === "connected") {
      document.body.dataset.callRef = call.ref || "";
      setStatus("in call");
    } else if (state === "failed") {
      finish(call, "ended: connection_failed");
    }
  }

  async function placeCall(call) {
    call.mic = await navigator.mediaDevices.getUserMedia({ audio: true });
    if (call.ended) return;
    call.micLevel = analyserFor(call, call.mic);
    call.meterTimer = setInterval(() => updateMeters(call), METER_MS);
    const pc = new RTCPeerConnection({ iceServers });
    call.pc = pc;
    for (const track of call.mic.getAudioTracks()) pc.addTrack(track, call.mic);
    call.channel = pc.createDataChannel("appbridge");
    call.channel.addEventListener("open", () => onChannelOpen(call));
    call.channel.addEventListener("message", (event) => onChannelMessage(call, event));
    // The gateway sends "ended" before it closes; a close without it is a lost connection.
    call.channel.addEventListener("close", () => finish(call, "ended: connection_closed"));
    pc.addEventListener("track", (event) => onRemoteTrack(call, event));
    pc.addEventListener("connectionstatechange", () => onConnectionState(call));
    await pc.setLocalDescription(await pc.createOffer());
    await waitForGathering(pc, GATHER_LIMIT_MS);
    if (call.ended) return;
    const res = await api("/v1/webrtc/calls", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer", ...call.target }),
    });
    if (!res.ok) throw new Error(await errorText(res));
    const answer = await res.json();
    call.ref = String(answer.callRef);
    if (call.ended) {
      // Hung up while the gateway was dialling the app: end the call it just set up.
      api(`/v1/console/calls/${encodeURIComponent(call.ref)}/hangup`, { method: "POST" });
      return;
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    pollTranscript(call);
  }

  async function startCall() {
    if (current) return;
    const app = ui.app.value;
    const number = ui.number.value.trim();
    if (!app && !number) {
      setStatus("error: enter a number or choose an app");
      return;
    }
    if (!navigator.mediaDevices || !window.RTCPeerConnection) {
      setStatus("error: the microphone needs https, or http on 127.0.0.1 (a secure context)");
      return;
    }
    const call = newCall(app ? { app } : { to: number });
    current = call;
    ui.transcript.replaceChildren();
    delete document.body.dataset.callRef;
    setBusy(true);
    setStatus("calling");
    try {
      await placeCall(call);
    } catch (err) {
      if (!call.ended) finish(call, `error: ${err && err.message ? err.message : String(err)}`);
    }
  }

  async function hangUp() {
    const call = current;
    if (!call || call.ended) return;
    if (!call.channel || !call.ref) {
      finish(call, "ended: caller_hangup"); // still dialling: placeCall ends it on the gateway
      return;
    }
    sendControl(call, { type: "hangup" });
    ui.hangup.disabled = true;
    // The gateway answers with "ended"; closing at once could drop the message in flight.
    setTimeout(() => finish(call, "ended: caller_hangup"), HANGUP_WAIT_MS);
  }

  function finish(call, statusText) {
    if (call.ended) return;
    call.ended = true;
    clearInterval(call.meterTimer);
    clearTimeout(call.pollTimer);
    if (call.pc) call.pc.close();
    if (call.mic) for (const track of call.mic.getTracks()) track.stop();
    call.audio.close().catch(() => {});
    ui.remote.srcObject = null;
    showLevel(ui.levelIn, SILENT_DBFS);
    showLevel(ui.levelOut, SILENT_DBFS);
    if (current === call) current = null;
    setStatus(statusText);
    setBusy(false);
    if (call.ref) fetchTimeline(call).catch(() => {}); // the turns that ended with the call
  }

  // ------------------------------------------------------------------ transcript

  function addTurn(entry) {
    const li = document.createElement("li");
    li.dataset.type = String(entry.type);
    const kind = document.createElement("span");
    kind.className = "turn-type";
    kind.textContent = String(entry.type).replace(/^turn\./, "");
    li.append(kind);
    const data = entry.data && typeof entry.data === "object" ? entry.data : {};
    if (typeof data.text === "string") {
      const text = document.createElement("span");
      text.className = "turn-text";
      text.textContent = data.text || (data.abandoned ? "(abandoned, no words)" : "(no words)");
      li.append(text);
    }
    ui.transcript.append(li);
    li.scrollIntoView({ block: "nearest" });
  }

  async function fetchTimeline(call) {
    const query = call.after === null ? "" : `?after=${encodeURIComponent(call.after)}`;
    const res = await api(`/v1/console/calls/${encodeURIComponent(call.ref)}/timeline${query}`);
    if (!res.ok) return;
    const body = await res.json();
    for (const entry of body.entries || []) {
      if (entry.kind === "message" && String(entry.type).startsWith("turn.")) addTurn(entry);
    }
    if (body.next !== undefined && body.next !== null) call.after = body.next;
  }

  async function pollTranscript(call) {
    if (call.ended) return;
    try {
      await fetchTimeline(call);
    } catch (_) {
      // a missed poll is retried on the next tick
    }
    if (!call.ended) call.pollTimer = setTimeout(() => pollTranscript(call), POLL_MS);
  }

  // ------------------------------------------------------------------ wiring

  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    startCall();
  });
  ui.hangup.addEventListener("click", hangUp);
  for (const key of ui.keys) {
    key.addEventListener("click", () => {
      if (current && current.pc) sendControl(current, { type: "dtmf", digit: key.dataset.digit });
    });
  }
  document.addEventListener("keydown", (event) => {
    const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement;
    if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
    const key = ui.keys.find((k) => k.dataset.digit === event.key);
    if (key) key.click();
  });
  window.addEventListener("pagehide", () => {
    if (current && current.channel && current.channel.readyState === "open") {
      current.channel.send(JSON.stringify({ type: "hangup" }));
    }
  });

  // A diagnostic handle (docs/web.md): the call's peer connection and streams, for measuring.
  window.appbridgePhone = {
    call: () =>
      current && {
        ref: current.ref,
        pc: current.pc,
        remoteStream: current.remoteStream,
        audioContext: current.audio,
      },
  };

  setStatus("idle");
  loadDirectory().catch((err) => setStatus(`error: ${err.message}`));
})();
