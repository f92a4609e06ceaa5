// The playground: plain browser APIs only (fetch streams, Web Audio), nothing loaded from outside.
//
// Play asks POST /v1/audio/speech/captioned for streamed NDJSON: one line per synthesized piece,
// carrying that piece's 24 kHz s16le PCM (base64) and its words with absolute start/end times.
// Each piece is scheduled on one AudioContext the moment it arrives, so audio starts with the
// first piece; a piece that arrives after the previous one finished starts a little later, and
// the segment table maps the context's clock back to audio time, so word highlighting stays
// right across such gaps. Download sends the same request to POST /v1/audio/speech in the
// chosen format.
'use strict';

(() => {
  const SAMPLE_RATE = 24000;
  const FLEET_EVERY_MS = 3000;
  const START_LEAD_S = 0.05;   // schedule slightly ahead of the clock so a piece never starts late
  const TICK_MS = 50;          // how often the position and the highlighted word are updated
  const DEFAULT_VOICE = 'af_heart';

  const $ = (id) => document.getElementById(id);
  const els = {
    form: $('speech-form'), text: $('text'), count: $('char-count'), mixer: $('mixer'),
    addVoice: $('add-voice'), spec: $('voice-spec'), speed: $('speed'), speedValue: $('speed-value'),
    format: $('format'), rate: $('rate'), keyField: $('api-key-field'), key: $('api-key'), play: $('play'),
    stop: $('stop'),
    download: $('download'), downloadLink: $('download-link'), error: $('error'), ttfa: $('ttfa'), rtf: $('rtf'),
    position: $('position'), progress: $('progress'), status: $('status'), transcript: $('transcript'),
    fleet: {
      replicas: $('fleet-replicas'), busy: $('fleet-busy'), idle: $('fleet-idle'), queue: $('fleet-queue'),
      refused: $('fleet-refused'), bars: $('fleet-bars'), note: $('fleet-note'),
      simulated: $('fleet-simulated'),
    },
  };

  let config = { max_input_chars: 4096, api_key_required: false };
  let voices = [];          // [{id, language, gender}] from GET /v1/audio/voices
  let audio = null;         // the one AudioContext, made on the first Play
  let session = null;       // the playback in progress (or last finished)
  let downloadUrl = null;

  // --- small helpers --------------------------------------------------------------------------

  function setStatus(text) { els.status.textContent = text; }

  function authHeaders(extra) {
    const headers = { ...(extra || {}) };
    const key = els.key.value.trim();
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  // The chosen sample rate, or null for the format's own (what the server picks when none is sent).
  function chosenRate() {
    return els.rate.value ? Number(els.rate.value) : null;
  }

  function requestBody(format, stream) {
    const body = {
      model: 'kokoro',
      input: els.text.value,
      voice: els.spec.value.trim(),
      speed: Number(els.speed.value),
      response_format: format,
      stream,
    };
    const rate = chosenRate();
    if (rate) body.sample_rate = rate;  // Play then sounds as a phone line would carry it
    return body;
  }

  function languageName(tag) {
    try {
      return new Intl.DisplayNames(['en'], { type: 'language' }).of(tag) || tag;
    } catch (e) {
      return tag;
    }
  }

  function formatSeconds(s) { return `${s.toFixed(1)} s`; }

  // --- errors: the server's OpenAI-shaped message, as it is ---------------------------------------

  function clearError() {
    els.error.hidden = true;
    els.error.replaceChildren();
    for (const el of [els.text, els.spec, els.speed, els.key]) el.removeAttribute('aria-invalid');
  }

  function showError(error, status, retryAfter) {
    const title = document.createElement('strong');
    const parts = [status ? `Error ${status}` : 'Error'];
    if (error.code) parts.push(error.code);
    title.textContent = parts.join(' · ');
    const message = document.createElement('span');
    message.className = 'message';
    message.textContent = error.message + (retryAfter ? ` Retry after ${retryAfter}.` : '');
    els.error.replaceChildren(title, message);
    els.error.hidden = false;
    const field = { input: els.text, voice: els.spec, speed: els.speed }[error.param] ||
      (status === 401 ? els.key : null);
    if (field) field.setAttribute('aria-invalid', 'true');
    setStatus('Failed.');
  }

  async function showResponseError(response) {
    let error = { message: `${response.status} ${response.statusText}`.trim() };
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) error = body.error;
    } catch (e) { /* not JSON: keep the status line */ }
    let retryAfter = null;
    if (response.status === 503) {
      const ms = Number(response.headers.get('retry-after-ms'));
      const s = Number(response.headers.get('retry-after'));
      if (ms > 0) retryAfter = `${(ms / 1000).toFixed(1)} s`;
      else if (s > 0) retryAfter = `${s} s`;
    }
    if (response.status === 401) els.keyField.hidden = false;
    showError(error, response.status, retryAfter);
  }

  // --- text ---------------------------------------------------------------------------------------

  function updateCount() {
    const n = els.text.value.length;
    const max = config.max_input_chars;
    const over = n - max;
    els.count.textContent = `${n} / ${max} characters` + (over > 0 ? ` (${over} over the limit)` : '');
    els.count.classList.toggle('over', over > 0);
  }

  // --- voices and the mixer -------------------------------------------------------------------------

  function fillVoiceSelect(select, chosen) {
    const groups = new Map();
    const sorted = [...voices].sort((a, b) =>
      languageName(a.language).localeCompare(languageName(b.language)) ||
      a.gender.localeCompare(b.gender) || a.id.localeCompare(b.id));
    for (const v of sorted) {
      const label = `${languageName(v.language)} · ${v.gender}`;
      if (!groups.has(label)) groups.set(label, []);
      groups.get(label).push(v);
    }
    const children = [];
    for (const [label, members] of groups) {
      const group = document.createElement('optgroup');
      group.label = label;
      for (const v of members) group.append(new Option(v.id, v.id, false, v.id === chosen));
      children.push(group);
    }
    select.replaceChildren(...children);
    if (!voices.some((v) => v.id === chosen) && voices.length) select.value = voices[0].id;
  }

  function mixRows() { return [...els.mixer.querySelectorAll('.mix-row')]; }

  function addMixRow(voice, weight) {
    const index = mixRows().length + 1;
    const row = document.createElement('div');
    row.className = 'mix-row';
    const voiceId = `mix-voice-${index}`;
    const weightId = `mix-weight-${index}`;
    row.innerHTML = `
      <div><label for="${voiceId}"></label><select id="${voiceId}" class="mix-voice"></select></div>
      <div><label for="${weightId}">Weight</label>
        <input id="${weightId}" class="mix-weight" type="number" min="0.1" max="100" step="any" value="1"></div>
      <button type="button" class="secondary remove">Remove</button>`;
    row.querySelector(`label[for="${voiceId}"]`).textContent = index === 1 ? 'Voice' : `Voice ${index}`;
    const select = row.querySelector('select');
    fillVoiceSelect(select, voice);
    row.querySelector('.mix-weight').value = String(weight);
    const remove = row.querySelector('.remove');
    remove.setAttribute('aria-label', `Remove voice ${index} from the mix`);
    remove.addEventListener('click', () => {
      row.remove();
      relabelRows();
      updateSpec();
      (mixRows().at(-1)?.querySelector('select') || els.addVoice).focus();
    });
    row.addEventListener('input', updateSpec);
    row.addEventListener('change', updateSpec);
    els.mixer.append(row);
    relabelRows();
    updateSpec();
    return row;
  }

  function relabelRows() {
    const rows = mixRows();
    rows.forEach((row, i) => {
      row.querySelector('label').textContent = rows.length === 1 ? 'Voice' : `Voice ${i + 1}`;
      const remove = row.querySelector('.remove');
      remove.hidden = rows.length === 1;
      remove.setAttribute('aria-label', `Remove voice ${i + 1} from the mix`);
      row.querySelector('.mix-weight').parentElement.hidden = rows.length === 1;
    });
  }

  // af_heart alone; af_bella(2)+af_sky(1) for a mix.
  function updateSpec() {
    const parts = mixRows().map((row) => ({
      voice: row.querySelector('select').value,
      weight: Number(row.querySelector('.mix-weight').value) || 1,
    })).filter((p) => p.voice);
    if (!parts.length) return;
    els.spec.value = parts.length === 1 ? parts[0].voice
      : parts.map((p) => `${p.voice}(${Number(p.weight.toFixed(3))})`).join('+');
  }

  async function loadVoices() {
    let response;
    try {
      response = await fetch('/v1/audio/voices', { headers: authHeaders() });
    } catch (e) {
      setStatus('Cannot reach the server; retrying.');
      setTimeout(loadVoices, 2000);
      return;
    }
    if (response.status === 503) {           // the model is still loading
      setStatus('The model is loading…');
      setTimeout(loadVoices, 2000);
      return;
    }
    if (!response.ok) {
      await showResponseError(response);
      return;
    }
    voices = (await response.json()).voices;
    const rows = mixRows();
    if (!rows.length) {
      addMixRow(DEFAULT_VOICE, 1);
    } else {
      for (const row of rows) fillVoiceSelect(row.querySelector('select'), row.querySelector('select').value);
      updateSpec();
    }
    clearError();
    setStatus(`Ready: ${voices.length} voices.`);
  }

  // --- Play: streamed PCM through Web Audio ---------------------------------------------------

  function audioContext() {
    if (!audio) {
      try {
        audio = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: 'interactive' });
      } catch (e) {           // a browser that cannot run at 24 kHz resamples our buffers instead
        audio = new AudioContext();
      }
    }
    return audio;
  }

  function base64Bytes(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  // s16le bytes to float samples; an odd trailing byte waits for the next piece.
  function pcmSamples(s, bytes) {
    let data = bytes;
    if (s.carry) {
      data = new Uint8Array(bytes.length + 1);
      data[0] = s.carry[0];
      data.set(bytes, 1);
      s.carry = null;
    }
    const whole = data.length - (data.length % 2);
    if (whole < data.length) s.carry = data.slice(whole);
    const view = new DataView(data.buffer, data.byteOffset, whole);
    const out = new Float32Array(whole / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  }

  function schedule(s, samples) {
    const ctx = audioContext();
    const buffer = ctx.createBuffer(1, samples.length, s.rate);  // Web Audio resamples to the context's rate
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    const at = Math.max(s.nextTime, ctx.currentTime + START_LEAD_S);
    source.start(at);
    s.sources.push(source);
    s.segments.push({ ctxStart: at, audioStart: s.audioSeconds, duration: buffer.duration });
    s.audioSeconds += buffer.duration;
    s.nextTime = at + buffer.duration;
    if (s.ttfa === null) {
      s.ttfa = (performance.now() - s.startedAt) / 1000;
      els.ttfa.textContent = `${Math.round(s.ttfa * 1000)} ms`;
      els.ttfa.dataset.seconds = String(s.ttfa);
      setStatus('Playing…');
    }
  }

  // Audio seconds heard so far: the context's clock mapped through the scheduled segments.
  function playedSeconds(s) {
    const now = audioContext().currentTime;
    let played = 0;
    for (const seg of s.segments) {
      if (now < seg.ctxStart) break;
      played = seg.audioStart + Math.min(now - seg.ctxStart, seg.duration);
    }
    return played;
  }

  // Each timed word is found in the text as typed, so the transcript keeps its punctuation and
  // spacing; a word the text does not show nearby (a spelled-out number) is shown as spoken.
  const WORD_SEARCH_CHARS = 40;

  function addWords(s, words) {
    for (const w of words) {
      const span = document.createElement('span');
      span.className = 'word';
      span.dataset.start = String(w.start_time);
      span.dataset.end = String(w.end_time);
      const at = s.text.indexOf(w.word, s.cursor);
      if (w.word && at >= 0 && at - s.cursor <= WORD_SEARCH_CHARS) {
        els.transcript.append(s.text.slice(s.cursor, at));
        s.cursor = at + w.word.length;
      } else if (s.words.length) {
        els.transcript.append(' ');
      }
      span.textContent = w.word;
      els.transcript.append(span);
      s.words.push({ start: w.start_time, end: w.end_time, el: span });
    }
  }

  function addTextTail(s) {
    const tail = s.text.slice(s.cursor);
    if (s.words.length && tail.length <= WORD_SEARCH_CHARS) els.transcript.append(tail);
  }

  function highlight(s, played) {
    let index = -1;
    for (let i = 0; i < s.words.length && s.words[i].start <= played; i++) index = i;
    if (index === s.current) return;
    if (s.current >= 0) {
      const previous = s.words[s.current].el;
      previous.classList.remove('current');
      previous.classList.add('spoken');
    }
    for (let i = Math.max(0, s.current); i < index; i++) s.words[i].el.classList.add('spoken');
    s.current = index;
    els.transcript.dataset.currentWord = String(index);
    if (index < 0) return;
    const el = s.words[index].el;
    el.classList.add('current');
    // keep the spoken word in view inside the transcript box (not by scrolling the page)
    const box = els.transcript;
    if (el.offsetTop < box.scrollTop || el.offsetTop + el.offsetHeight > box.scrollTop + box.clientHeight) {
      box.scrollTop = el.offsetTop - box.clientHeight / 3;
    }
  }

  function tick(s) {
    if (s !== session) return;
    const played = playedSeconds(s);
    els.position.textContent = `${played.toFixed(1)} / ${formatSeconds(s.audioSeconds)}`;
    els.position.dataset.seconds = played.toFixed(3);
    els.progress.max = Math.max(s.audioSeconds, 0.001);
    els.progress.value = played;
    highlight(s, played);
    if (s.done && audioContext().currentTime >= s.nextTime) finish(s, s.failed ? null : 'Done.');
  }

  function finish(s, message) {
    clearInterval(s.ticker);
    s.ticker = null;
    if (message) setStatus(message);
    if (s === session) {
      els.play.disabled = false;
      els.stop.disabled = true;
    }
  }

  function stop(message) {
    const s = session;
    if (!s) return;
    s.controller.abort();
    for (const source of s.sources) {
      try { source.stop(); } catch (e) { /* not started yet */ }
    }
    finish(s, message);
  }

  function handleLine(s, line) {
    if (line.error) {                      // synthesis failed midway: the server says so in-band
      s.failed = true;
      showError(line.error);
      return;
    }
    const samples = pcmSamples(s, base64Bytes(line.audio || ''));
    if (samples.length) schedule(s, samples);
    if (line.timestamps && line.timestamps.length) addWords(s, line.timestamps);
  }

  async function play(event) {
    if (event) event.preventDefault();
    stop();
    clearError();
    const s = {
      controller: new AbortController(), sources: [], segments: [], words: [], current: -1, carry: null,
      text: els.text.value, cursor: 0,
      rate: chosenRate() || SAMPLE_RATE, audioSeconds: 0, nextTime: 0, ttfa: null, done: false, failed: false,
      ticker: null,
      startedAt: performance.now(),
    };
    session = s;
    els.transcript.replaceChildren();
    els.transcript.dataset.currentWord = '-1';
    els.ttfa.textContent = '…';
    els.rtf.textContent = '…';
    delete els.ttfa.dataset.seconds;
    delete els.rtf.dataset.value;
    els.play.disabled = true;
    els.stop.disabled = false;
    setStatus('Synthesizing…');
    const ctx = audioContext();
    if (ctx.state !== 'running') ctx.resume();  // within the click, so autoplay rules allow it
    s.ticker = setInterval(() => tick(s), TICK_MS);

    let response;
    try {
      response = await fetch('/v1/audio/speech/captioned', {
        method: 'POST',
        headers: authHeaders({ 'Content-Type': 'application/json' }),
        body: JSON.stringify(requestBody('pcm', true)),
        signal: s.controller.signal,
      });
    } catch (e) {
      if (!s.controller.signal.aborted) showError({ message: `Cannot reach the server: ${e.message}` });
      finish(s);
      return;
    }
    if (!response.ok) {
      await showResponseError(response);
      finish(s);
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = pending.indexOf('\n')) >= 0) {
          const text = pending.slice(0, newline);
          pending = pending.slice(newline + 1);
          if (text.trim()) handleLine(s, JSON.parse(text));
        }
      }
      if (pending.trim()) handleLine(s, JSON.parse(pending));
      addTextTail(s);
    } catch (e) {
      if (s.controller.signal.aborted) return;
      s.failed = true;
      showError({ message: `The stream broke off: ${e.message}` });
    }
    s.done = true;
    const synthesis = (performance.now() - s.startedAt) / 1000;
    if (s.audioSeconds > 0) {
      const rtf = synthesis / s.audioSeconds;
      const faster = document.createElement('small');
      faster.textContent = `${(1 / rtf).toFixed(1)}× real time`;
      els.rtf.replaceChildren(rtf.toFixed(2), faster);
      els.rtf.dataset.value = String(rtf);
    } else {
      els.rtf.textContent = '–';
      if (!s.failed) showError({ message: 'The server sent no audio.' });
      s.failed = true;
    }
  }

  // --- Download: the same request, in the chosen format ----------------------------------------

  async function download() {
    clearError();
    const format = els.format.value;
    els.download.disabled = true;
    setStatus(`Synthesizing ${format} for download…`);
    try {
      const response = await fetch('/v1/audio/speech', {
        method: 'POST',
        headers: authHeaders({ 'Content-Type': 'application/json' }),
        body: JSON.stringify(requestBody(format, false)),
      });
      if (!response.ok) {
        await showResponseError(response);
        return;
      }
      const blob = await response.blob();
      if (downloadUrl) URL.revokeObjectURL(downloadUrl);
      downloadUrl = URL.createObjectURL(blob);
      const name = `speech.${format}`;
      els.downloadLink.href = downloadUrl;
      els.downloadLink.download = name;
      els.downloadLink.textContent = `${name} (${Math.max(1, Math.round(blob.size / 1024))} kB)`;
      els.downloadLink.hidden = false;
      els.downloadLink.click();
      setStatus(`Downloaded ${name}.`);
    } catch (e) {
      showError({ message: `Cannot reach the server: ${e.message}` });
    } finally {
      els.download.disabled = false;
    }
  }

  // --- the fleet panel ----------------------------------------------------------------------------

  function renderFleet(f) {
    const d = els.fleet;
    d.simulated.hidden = !f.simulated;
    d.replicas.textContent = String(f.replicas);
    d.busy.textContent = String(f.busy);
    d.idle.textContent = String(f.idle);
    const unit = document.createElement('small');
    unit.textContent = f.queue_unit;
    d.queue.replaceChildren(String(f.queue_depth), unit);
    d.refused.textContent = String(f.refused);
    const bars = [];
    for (let i = 0; i < f.replicas; i++) {
      const bar = document.createElement('span');
      const busy = i < f.busy;
      bar.className = busy ? 'busy' : 'idle';
      bar.textContent = busy ? 'busy' : 'idle';
      bars.push(bar);
    }
    d.bars.replaceChildren(...bars);
    const mode = { fleet: 'shared queue', degraded: 'queue unreachable: serving locally', single: 'one worker' }[f.mode];
    d.note.textContent = (f.ready ? '' : 'Model loading. ') + (mode ? `${mode[0].toUpperCase()}${mode.slice(1)}. ` : '') +
      `Refused: requests answered 503 because the fleet was full. Refreshed every ${FLEET_EVERY_MS / 1000} s.`;
  }

  async function refreshFleet() {
    try {
      const response = await fetch('/playground/fleet', { cache: 'no-store' });
      if (response.ok) renderFleet(await response.json());
    } catch (e) {
      els.fleet.note.textContent = 'Cannot reach the server.';
    } finally {
      setTimeout(refreshFleet, FLEET_EVERY_MS);
    }
  }

  // --- start ------------------------------------------------------------------------------------

  async function start() {
    try {
      const response = await fetch('/playground/config');
      if (response.ok) config = await response.json();
    } catch (e) { /* keep the defaults; voices and requests report the real trouble */ }
    els.keyField.hidden = !config.api_key_required;
    updateCount();
    els.text.addEventListener('input', updateCount);
    els.speed.addEventListener('input', () => { els.speedValue.textContent = `${Number(els.speed.value).toFixed(2)}×`; });
    els.form.addEventListener('submit', play);
    els.stop.addEventListener('click', () => stop('Stopped.'));
    els.download.addEventListener('click', download);
    els.addVoice.addEventListener('click', () => {
      const used = new Set(mixRows().map((row) => row.querySelector('select').value));
      const next = voices.find((v) => !used.has(v.id));
      const row = addMixRow(next ? next.id : DEFAULT_VOICE, 1);
      row.querySelector('select').focus();
    });
    els.key.addEventListener('change', () => { if (!voices.length) loadVoices(); });
    els.text.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        els.form.requestSubmit();
      }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && session && !els.stop.disabled) stop('Stopped.');
    });
    refreshFleet();
    if (!config.api_key_required || els.key.value) {
      await loadVoices();
    } else {
      setStatus('Enter the API key to load the voices.');
    }
  }

  start();
})();
