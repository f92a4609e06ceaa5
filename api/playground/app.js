// The playground: plain browser APIs only (fetch streams, Web Audio), nothing loaded from outside.
//
// Play asks POST /v1/audio/speech/captioned for streamed NDJSON: one line per synthesized piece,
// carrying that piece's 24 kHz s16le PCM (base64) and its words with absolute start/end times and
// the slice of the typed text each was read from, which the transcript highlights.
// Each piece is scheduled on one AudioContext the moment it arrives, so audio starts with the
// first piece; a piece that arrives after the previous one finished starts a little later, and
// the segment table maps the context's clock back to audio time, so word highlighting stays
// right across such gaps. Download sends the same request to POST /v1/audio/speech in the
// chosen format.
//
// Live mode opens the WebSocket /v1/audio/speech/live (protocol in api/live.py), sends `start`
// (voice, speed, pcm, timestamps, sample rate), then the text a word at a time at the chosen
// writing speed, as a language model writes it, then `end`. Its binary frames (s16le PCM at the
// `started` event's rate) go through the same scheduling and segment table as Play's pieces; its
// `words` events (seconds from the session's first sample) feed the same highlighting, and their
// `piece_latency` (on a sentence's first words) the sentence-latency figure. Interrupt
// sends `clear` and stops the scheduled sources at once; audio that still arrives before the
// server's `cleared` belongs to the dropped text and is counted on the clock, never played.
'use strict';

(() => {
  const SAMPLE_RATE = 24000;
  const FLEET_EVERY_MS = 3000;
  const START_LEAD_S = 0.05;   // schedule slightly ahead of the clock so a piece never starts late
  const TICK_MS = 50;          // how often the position and the highlighted word are updated
  const DEFAULT_VOICE = 'af_heart';
  const LIVE_PATH = '/v1/audio/speech/live';
  // WebSocket close codes the live endpoint uses (RFC 6455 section 7.4.1; 1013 from IANA's registry).
  const CLOSE_CODES = {
    1006: 'connection lost', 1008: 'policy violation', 1011: 'server error', 1013: 'try again later',
  };

  const $ = (id) => document.getElementById(id);
  const els = {
    form: $('speech-form'), text: $('text'), count: $('char-count'), mixer: $('mixer'),
    addVoice: $('add-voice'), spec: $('voice-spec'), speed: $('speed'), speedValue: $('speed-value'),
    format: $('format'), rate: $('rate'), keyField: $('api-key-field'), key: $('api-key'), play: $('play'),
    stop: $('stop'), modes: [...document.querySelectorAll('input[name="mode"]')], textHelp: $('text-help'),
    wps: $('wps'), wpsValue: $('wps-value'), speakLive: $('speak-live'), interrupt: $('interrupt'),
    liveStop: $('live-stop'), next: $('next-text'), addNext: $('add-next'),
    figures: $('figures'), latency: $('latency'), ahead: $('ahead'),
    preview: $('preview'), previewPanel: $('preview-panel'), previewChunks: $('preview-chunks'),
    previewStale: $('preview-stale'),
    download: $('download'), downloadLink: $('download-link'), error: $('error'), ttfa: $('ttfa'), rtf: $('rtf'),
    position: $('position'), progress: $('progress'), status: $('status'), transcript: $('transcript'),
    fleet: {
      replicas: $('fleet-replicas'), busy: $('fleet-busy'), idle: $('fleet-idle'), queue: $('fleet-queue'),
      refused: $('fleet-refused'), bars: $('fleet-bars'), note: $('fleet-note'),
      simulated: $('fleet-simulated'),
    },
    voiceForm: $('voice-form'), voiceFile: $('voice-file'), voiceName: $('voice-name'),
    voiceTranscript: $('voice-transcript'), record: $('record'), recordStop: $('record-stop'),
    recordTime: $('record-time'), fit: $('fit'), fitCancel: $('fit-cancel'), voiceError: $('voice-error'),
    voiceUnavailable: $('voice-unavailable'), fitJob: $('fit-job'), fitPhase: $('fit-phase'), fitDone: $('fit-done'),
    fitBest: $('fit-best'), fitEta: $('fit-eta'), fitProgress: $('fit-progress'), fitStatus: $('fit-status'),
    fitReport: $('fit-report'), sampleAudio: $('sample-audio'), sampleCaption: $('sample-caption'),
    sampleNone: $('sample-none'), fittedAudio: $('fitted-audio'), fittedCaption: $('fitted-caption'),
    fittedSaid: $('fitted-said'), useVoice: $('use-voice'),
  };

  let config = { max_input_chars: 4096, api_key_required: false, voice_fitting: true };
  let voices = [];          // [{id, language, gender}] from GET /v1/audio/voices
  let audio = null;         // the one AudioContext, made on the first Play
  let session = null;       // the playback in progress (or last finished): a Play request or a live session
  let mode = 'request';     // which of the form's two modes is shown: 'request' or 'live'
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

  // `box` shows "Error 400 · code" over the server's message (and when to retry, for a 503).
  function renderError(box, error, status, retryAfter, heading) {
    const title = document.createElement('strong');
    const parts = [heading || (status ? `Error ${status}` : 'Error')];
    if (error.code) parts.push(error.code);
    title.textContent = parts.join(' · ');
    const message = document.createElement('span');
    message.className = 'message';
    const sentence = /[.!?]$/.test(error.message) ? error.message : `${error.message}.`;
    message.textContent = retryAfter ? `${sentence} Retry after ${retryAfter}.` : error.message;
    box.replaceChildren(title, message);
    box.hidden = false;
  }

  function showError(error, status, retryAfter, heading) {
    renderError(els.error, error, status, retryAfter, heading);
    const field = { input: els.text, voice: els.spec, speed: els.speed }[error.param] ||
      (status === 401 ? els.key : null);
    if (field) field.setAttribute('aria-invalid', 'true');
    setStatus('Failed.');
  }

  async function showResponseError(response) {
    const { error, retryAfter } = await responseError(response);
    if (response.status === 401) els.keyField.hidden = false;
    showError(error, response.status, retryAfter);
  }

  // A failed response's OpenAI error (or its status line) and, for a 503, when to retry.
  async function responseError(response) {
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
    return { error, retryAfter };
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
    setVoices((await response.json()).voices);
    clearError();
    setStatus(`Ready: ${voices.length} voices.`);
  }

  // The voices listed: the mixer's selects refilled, each keeping its choice.
  function setVoices(listed) {
    voices = listed;
    const rows = mixRows();
    if (!rows.length) {
      addMixRow(DEFAULT_VOICE, 1);
    } else {
      for (const row of rows) fillVoiceSelect(row.querySelector('select'), row.querySelector('select').value);
      updateSpec();
    }
  }

  // The voices again, quietly (a voice was fitted): the status and errors are the playback's.
  async function reloadVoices() {
    try {
      const response = await fetch('/v1/audio/voices', { headers: authHeaders(), cache: 'no-store' });
      if (response.ok) setVoices((await response.json()).voices);
    } catch (e) { /* the next try, or the next page load, lists it */ }
  }

  // --- playback, shared by Play and Live: streamed PCM through Web Audio ----------------------

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
    source.onended = () => {  // played out or stopped: nothing left to stop
      const i = s.sources.indexOf(source);
      if (i >= 0) s.sources.splice(i, 1);
    };
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

  // Stop every scheduled source now, started or not, and end the clock's map where the listener is:
  // the position stays there, and the next audio (after an interrupt) starts right away.
  function silence(s) {
    const now = audioContext().currentTime;
    for (const source of s.sources) {
      try { source.stop(); } catch (e) { /* never started */ }
      source.disconnect();
    }
    s.sources = [];
    s.segments = s.segments.filter((seg) => seg.ctxStart < now);
    const last = s.segments.at(-1);
    if (last) last.duration = Math.min(last.duration, now - last.ctxStart);
    s.nextTime = 0;
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

  // Each timed word shows the text as typed (Live: as written so far), so the transcript keeps its
  // punctuation, spacing and markup. A word that says where it was read from (`input_start`,
  // `input_end`) marks that slice: the five words "twelve dollars and ninety-nine cents" all light
  // up the "$12.99" typed. Without it (an older server), a word is searched for in the text, and one
  // the text does not show nearby (a spelled-out number) is shown as spoken. Live keeps the text
  // written but not yet voiced in `s.tail`, after the words.
  const WORD_SEARCH_CHARS = 40;

  function put(s, ...nodes) {
    if (s.tail) s.tail.before(...nodes);
    else els.transcript.append(...nodes);
  }

  // The slice of the text `w` was read from, if the server said and it lies in the text written.
  function spanOf(s, w) {
    const [start, end] = [w.input_start, w.input_end];
    if (!Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end > s.text.length || end < start) return null;
    return [start, end];
  }

  // The words added, each with its element and where it stands in the text (`offset`, `length`).
  function addWords(s, words) {
    const added = [];
    for (const w of words) {
      const word = { start: w.start_time, end: w.end_time, offset: s.cursor, length: 0 };
      const span = spanOf(s, w);
      const last = s.words[s.words.length - 1];
      if (span && last && last.spanned && span[0] < last.offset + last.length) {
        // read from the same slice as the word before: the same mark, which speaks it too
        word.el = last.el;
        [word.offset, word.length, word.spanned] = [last.offset, last.length, true];
        word.el.title += ` ${w.word}`;
      } else if (span && span[1] >= s.cursor) {
        const start = Math.max(span[0], s.cursor);
        put(s, s.text.slice(s.cursor, start));
        word.el = mark(w, s.text.slice(start, span[1]));
        word.el.title = w.word;
        Object.assign(word.el.dataset, { inputStart: String(start), inputEnd: String(span[1]) });
        [word.offset, word.length, word.spanned] = [start, span[1] - start, true];
        s.cursor = span[1];
        put(s, word.el);
      } else {
        const at = s.text.indexOf(w.word, s.cursor);
        if (w.word && at >= 0 && at - s.cursor <= WORD_SEARCH_CHARS) {
          put(s, s.text.slice(s.cursor, at));
          [word.offset, word.length] = [at, w.word.length];
          s.cursor = at + w.word.length;
        } else if (s.words.length) {
          put(s, ' ');
        }
        word.el = mark(w, w.word);
        put(s, word.el);
      }
      s.words.push(word);
      added.push(word);
    }
    els.transcript.dataset.words = String(s.words.length);
    return added;
  }

  function mark(w, text) {
    const span = document.createElement('span');
    span.className = 'word';
    span.dataset.start = String(w.start_time);
    span.dataset.end = String(w.end_time);
    span.textContent = text;
    return span;
  }

  // The text after the last word (its full stop), all of it when the words marked slices of it.
  function addTextTail(s) {
    const tail = s.text.slice(s.cursor);
    const spanned = s.words.length && s.words[s.words.length - 1].spanned;
    if (s.words.length && (spanned || tail.length <= WORD_SEARCH_CHARS)) els.transcript.append(tail);
  }

  function highlight(s, played) {
    let index = -1;
    for (let i = 0; i < s.words.length && s.words[i].start <= played; i++) index = i;
    if (index === s.current) return;
    const el = index >= 0 ? s.words[index].el : null;  // words read from one slice share it
    if (s.current >= 0 && s.words[s.current].el !== el) {
      const previous = s.words[s.current].el;
      previous.classList.remove('current');
      previous.classList.add('spoken');
    }
    for (let i = Math.max(0, s.current); i < index; i++) {
      if (s.words[i].el !== el) s.words[i].el.classList.add('spoken');
    }
    s.current = index;
    els.transcript.dataset.currentWord = String(index);
    if (index < 0) return;
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
    if (s.kind === 'live') showAhead(s);
    if (s.done && audioContext().currentTime >= s.nextTime) finish(s, s.failed ? null : 'Done.');
  }

  // A new playback of either kind ('request' or 'live'): the previous one stopped, the figures reset.
  function newSession(kind, fields) {
    stop();
    clearError();
    const s = {
      kind, sources: [], segments: [], words: [], current: -1, carry: null, text: '', cursor: 0, tail: null,
      rate: chosenRate() || SAMPLE_RATE, audioSeconds: 0, nextTime: 0, ttfa: null, done: false, failed: false,
      ticker: null, startedAt: performance.now(), cancel() {}, ...fields,
    };
    session = s;
    els.transcript.replaceChildren();
    els.transcript.dataset.currentWord = '-1';
    els.transcript.dataset.words = '0';
    els.ttfa.textContent = '…';
    delete els.ttfa.dataset.seconds;
    setRunning(kind);
    const ctx = audioContext();
    if (ctx.state !== 'running') ctx.resume();  // within the click, so autoplay rules allow it
    s.ticker = setInterval(() => tick(s), TICK_MS);
    return s;
  }

  // The buttons of both modes while `kind` runs ('request', 'live'), or nothing does (null).
  function setRunning(kind) {
    els.play.disabled = els.speakLive.disabled = kind !== null;
    els.stop.disabled = kind !== 'request';
    els.liveStop.disabled = els.interrupt.disabled = kind !== 'live';
    els.next.disabled = els.addNext.disabled = kind !== 'live';
  }

  function finish(s, message) {
    clearInterval(s.ticker);
    s.ticker = null;
    s.cancel();
    if (message) setStatus(message);
    if (s === session) setRunning(null);
  }

  function stop(message) {
    const s = session;
    if (!s) return;
    s.cancel();
    silence(s);
    finish(s, message);
  }

  // --- Play: one request, its captioned stream -------------------------------------------------

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
    const controller = new AbortController();
    const s = newSession('request', { controller, text: els.text.value, cancel: () => controller.abort() });
    els.rtf.textContent = '…';
    delete els.rtf.dataset.value;
    setStatus('Synthesizing…');

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

  // --- Live: the text written a word at a time over WS /v1/audio/speech/live --------------------

  const WORD = /[\p{L}\p{N}]+(?:['’-][\p{L}\p{N}]+)*/gu;
  const isSpace = (ch) => /\s/.test(ch);

  // The text as a model would send it: each word with the spaces (or line breaks) after it.
  function tokensOf(text) {
    return text.trim().match(/\S+\s*/g) || [];
  }

  function liveOpen(s) {
    return s.ws !== null && s.ws.readyState === WebSocket.OPEN;
  }

  function speakLive(event) {
    if (event) event.preventDefault();
    const tokens = tokensOf(els.text.value);
    const s = newSession('live', {
      ws: null, opened: false, started: false, queue: tokens, sent: 0, writer: null, ending: false,
      clearing: false, interrupted: false, closedByPage: false, lastError: null,
      droppedTo: 0, latencies: [],
    });
    s.cancel = () => closeLive(s);
    s.tail = document.createElement('span');
    s.tail.className = 'unvoiced';
    els.transcript.append(s.tail);
    for (const el of [els.latency, els.ahead]) {
      el.textContent = '–';
      for (const key of Object.keys(el.dataset)) delete el.dataset[key];
    }
    if (!tokens.length) {
      showError({ message: 'There is no text to speak: type some first.', param: 'input' });
      finish(s);
      return;
    }
    setStatus('Connecting…');
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    try {
      // A page cannot set the Authorization header on a WebSocket: the key goes as a subprotocol,
      // beside the plain one the server answers with (api/live.py).
      const key = els.key.value.trim();
      const protocols = key ? ['kokoro-live', `openai-insecure-api-key.${key}`] : [];
      s.ws = new WebSocket(`${scheme}//${location.host}${LIVE_PATH}`, protocols);
    } catch (e) {
      showError({ message: `Cannot open the live connection: ${e.message}` });
      finish(s);
      return;
    }
    s.ws.binaryType = 'arraybuffer';
    s.ws.addEventListener('open', () => {
      s.opened = true;
      const start = {
        type: 'start', voice: els.spec.value.trim(), speed: Number(els.speed.value), response_format: 'pcm',
        timestamps: true,
      };
      const rate = chosenRate();
      if (rate) start.sample_rate = rate;
      s.ws.send(JSON.stringify(start));
    });
    s.ws.addEventListener('message', (e) => { if (s === session && !s.closedByPage) liveMessage(s, e.data); });
    s.ws.addEventListener('close', (e) => liveClosed(s, e));
  }

  function liveMessage(s, data) {
    if (typeof data !== 'string') {
      liveAudio(s, new Uint8Array(data));
      return;
    }
    let event;
    try {
      event = JSON.parse(data);
    } catch (e) {
      return;
    }
    if (event.type === 'started') {
      s.rate = event.sample_rate;
      s.started = true;
      write(s);
    } else if (event.type === 'words') {
      liveWords(s, event.words || [], event.piece_latency);
    } else if (event.type === 'cleared') {
      cleared(s);
    } else if (event.type === 'done') {
      s.done = true;
      s.tail.className = '';  // what is left (a closing quote, the last full stop) was spoken with its words
    } else if (event.type === 'error' && event.error) {
      s.lastError = event.error;  // the session goes on, unless a close follows
      showError(event.error);
    }
  }

  function liveAudio(s, bytes) {
    const samples = pcmSamples(s, bytes);
    if (!samples.length) return;
    if (s.clearing) {  // the dropped text's last audio, sent before `cleared`: on the session's clock, never heard
      s.audioSeconds += samples.length / s.rate;
      return;
    }
    schedule(s, samples);
  }

  // `latency`: on a sentence's (a piece's) first words, the server's seconds from its text being
  // complete to its first audio, which the server can time exactly: it is what cut the text.
  function liveWords(s, words, latency) {
    const added = addWords(s, words);
    if (s.clearing) {
      drop(s, added);
    } else if (typeof latency === 'number') {
      showLatency(s, latency);
    }
    s.tail.textContent = s.text.slice(s.cursor);
  }

  function showLatency(s, latency) {
    s.latencies.push(latency);
    const max = Math.max(...s.latencies);
    const detail = document.createElement('small');
    const n = s.latencies.length;
    detail.textContent = `last; max ${max.toFixed(2)} s over ${n} sentence${n === 1 ? '' : 's'}`;
    els.latency.replaceChildren(`${latency.toFixed(2)} s`, detail);
    Object.assign(els.latency.dataset, { last: String(latency), max: String(max), count: String(n) });
  }

  // Words written and not yet heard (the text a model has written ahead of the speech).
  function showAhead(s) {
    const heard = s.current >= 0 ? s.words[s.current] : null;
    const from = Math.max(heard ? heard.offset + heard.length : 0, s.droppedTo);
    const ahead = (s.text.slice(from).match(WORD) || []).length;
    if (String(ahead) === els.ahead.dataset.words) return;
    els.ahead.dataset.words = String(ahead);
    const note = document.createElement('small');
    note.textContent = 'written, not yet heard';
    els.ahead.replaceChildren(`${ahead} word${ahead === 1 ? '' : 's'}`, note);
  }

  // The writer: the next word every 1/speed seconds (the speed may change as it writes), then `end`.
  function write(s) {
    if (s.writer !== null || !s.started || s.clearing || !liveOpen(s) || s !== session) return;
    const token = s.queue.shift();
    if (token === undefined) {
      if (!s.interrupted) endLive(s);
      return;
    }
    const now = performance.now();
    if (!s.sent) s.startedAt = now;  // first audio counts from the first word written
    s.ws.send(JSON.stringify({ type: 'text', text: token }));
    s.text += token;
    s.sent += 1;
    s.tail.textContent = s.text.slice(s.cursor);
    setStatus(`Writing: ${s.sent} words sent, ${s.queue.length} to go…`);
    if (!s.queue.length) {
      endLive(s);
      return;
    }
    s.writer = setTimeout(() => {
      s.writer = null;
      write(s);
    }, 1000 / Number(els.wps.value));
  }

  function endLive(s) {
    if (s.ending || !liveOpen(s)) return;
    s.ending = true;
    s.ws.send(JSON.stringify({ type: 'end' }));
    els.next.disabled = els.addNext.disabled = true;
    setStatus(`Written: ${s.sent} words; speaking the rest…`);
  }

  // Words spoken (or about to be) that the listener will not hear: struck through, out of the highlighting.
  function drop(s, words) {
    for (const w of words) w.el.classList.add('dropped');
    s.words = s.words.filter((w) => !words.includes(w));
    els.transcript.dataset.words = String(s.words.length);
  }

  // Barge-in: `clear`, and the audio not yet heard stops now rather than when the server answers.
  function interrupt() {
    const s = session;
    if (!s || s.kind !== 'live' || s.clearing || !liveOpen(s)) return;
    s.ws.send(JSON.stringify({ type: 'clear' }));
    clearTimeout(s.writer);
    s.writer = null;
    s.queue = [];
    s.interrupted = true;
    s.clearing = true;
    silence(s);
    highlight(s, playedSeconds(s));
    drop(s, s.words.slice(s.current + 1));
    els.interrupt.disabled = true;
    setStatus('Interrupted: the server is clearing…');
  }

  function cleared(s) {
    s.clearing = false;
    const rest = s.text.slice(s.cursor);
    if (rest.trim()) {
      const span = document.createElement('span');
      span.className = 'dropped';
      span.textContent = rest;
      s.tail.before(span);
    }
    s.cursor = s.droppedTo = s.text.length;
    s.tail.textContent = '';
    s.clears = (s.clears || 0) + 1;
    els.status.dataset.cleared = String(s.clears);
    els.interrupt.disabled = false;
    if (s.ending) {
      setStatus('Interrupted: the session ends.');
    } else if (s.queue.length) {  // "say next" came while the server cleared
      s.interrupted = false;
      write(s);
    } else {
      setStatus('Interrupted: the server dropped the text not yet spoken. Say what comes next, or Stop.');
    }
  }

  function sayNext() {
    const s = session;
    const tokens = tokensOf(els.next.value);
    if (!s || s.kind !== 'live' || s.ending || !tokens.length || !liveOpen(s)) return;
    const before = s.queue.length ? s.queue[s.queue.length - 1] : s.text;
    if (before && !isSpace(before.at(-1))) {  // a space between what is written and what comes next
      if (s.queue.length) s.queue[s.queue.length - 1] += ' ';
      else tokens[0] = ` ${tokens[0]}`;
    }
    s.queue.push(...tokens);
    els.next.value = '';
    s.interrupted = false;
    write(s);  // nothing while the writer runs or the server clears: they go on with it
  }

  function closeLive(s) {
    clearTimeout(s.writer);
    s.writer = null;
    if (s.ws && s.ws.readyState <= WebSocket.OPEN) {
      s.closedByPage = true;
      s.ws.close(1000);
    }
  }

  function liveClosed(s, event) {
    clearTimeout(s.writer);
    s.writer = null;
    if (s.closedByPage || s !== session) return;
    s.done = true;  // what was scheduled plays out, then the run finishes
    if (event.code === 1000) return;
    s.failed = true;
    if (!s.opened) {
      refused(s);
      return;
    }
    const name = CLOSE_CODES[event.code];
    const heading = `Closed ${event.code}${name ? ` · ${name}` : ''}`;
    const error = event.code !== 1006 && s.lastError ? s.lastError
      : { message: event.reason || 'The connection to the server was lost.' };
    showError(error, null, null, heading);
  }

  // The upgrade was refused (401 or 503 before the socket opened): a browser only sees a failed
  // connection, so say what the server would answer an HTTP request now.
  async function refused(s) {
    const refusal = 'The server refused the live connection';
    let response;
    try {
      response = await fetch('/v1/audio/voices', { headers: authHeaders(), cache: 'no-store' });
    } catch (e) {
      showError({ message: `${refusal}, and cannot be reached: ${e.message}` }, null, null, 'Refused');
      return;
    }
    if (s !== session) return;
    if (!response.ok) {
      const { error, retryAfter } = await responseError(response);
      showError({ ...error, message: `${refusal}: ${error.message}` }, response.status, retryAfter);
      return;
    }
    showError({ message: `${refusal} before it opened (a browser is not told why). It answers other requests, ` +
      'so it is probably full: retry in a few seconds, and see the fleet panel.' }, null, null, 'Refused');
  }

  // --- the two modes ------------------------------------------------------------------------------

  function setMode(next) {
    if (next === mode) return;
    if (session && session.ticker) stop('Stopped.');
    mode = next;
    for (const el of document.querySelectorAll('[data-mode]')) el.hidden = el.dataset.mode !== mode;
    els.figures.classList.toggle('live', mode === 'live');
    els.textHelp.textContent = mode === 'live' ? 'Ctrl+Enter speaks live, Escape stops.'
      : 'Ctrl+Enter plays, Escape stops.';
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

  // --- What is read: the text as the server reads it, piece by piece (POST /dev/phonemize) -------

  // The language the server reads the text in: the first voice's, whose name starts with its
  // language's letter as Kokoro's do (af_heart: American English); OpenAI's names are English.
  function voiceLanguage() {
    const first = els.spec.value.trim().split('+')[0].replace(/\(.*$/, '').trim();
    return /^[abefhijpz][fm]_/.test(first) ? first[0] : 'a';
  }

  async function preview() {
    clearError();
    els.preview.disabled = true;
    const text = els.text.value;
    try {
      const response = await fetch('/dev/phonemize', {
        method: 'POST',
        headers: authHeaders({ 'Content-Type': 'application/json' }),
        body: JSON.stringify({ text, language: voiceLanguage() }),
      });
      if (!response.ok) {
        await showResponseError(response);
        return;
      }
      const body = await response.json();
      els.previewChunks.replaceChildren(...body.chunks.map((chunk) => {
        const item = document.createElement('li');
        const read = document.createElement('span');
        read.className = 'read';
        read.textContent = chunk.text;
        const phonemes = document.createElement('code');
        phonemes.className = 'phonemes';
        phonemes.textContent = chunk.phonemes;
        item.append(read, phonemes);
        return item;
      }));
      els.previewPanel.dataset.text = text;
      els.previewPanel.hidden = false;
      markPreviewStale();
    } catch (e) {
      showError({ message: `Cannot reach the server: ${e.message}` });
    } finally {
      els.preview.disabled = false;
    }
  }

  // A preview of another text than the box's is shown greyed, with a note, until asked again.
  function markPreviewStale() {
    const stale = !els.previewPanel.hidden && els.previewPanel.dataset.text !== els.text.value;
    els.previewPanel.classList.toggle('stale', stale);
    els.previewStale.hidden = !stale;
  }

  // --- Your voice: a voice fitted to a recording (POST /v1/audio/voices; docs/voices.md) ----------
  //
  // The sample is a file picked or a recording from the microphone, sent as MediaRecorder makes it
  // (webm/opus in Chromium, ogg/opus in Firefox, mp4 in Safari: the server decodes them all). The
  // job is followed through its server-sent events, read with fetch because an EventSource cannot
  // send the API key; if that stream breaks, the job is polled. Once fitted, the voices are
  // reloaded (the mixer lists it) and it says a sentence in a player beside the sample's.

  const MAX_RECORDING_S = 60;
  const POLL_MS = 1000;
  const FINISHED = ['succeeded', 'failed', 'cancelled'];
  const FIT_PHASES = {
    queued: 'waiting to start', running: 'starting', loading: 'loading the model', check: 'reading the sample',
    stock: 'hearing the stock voices', mixture: 'mixing stock voices', refine: 'refining beyond the mixes',
    done: 'writing the voice', succeeded: 'fitted', failed: 'failed', cancelled: 'cancelled',
  };
  const FITTED_SAYS = 'This is my own voice, fitted from a short recording.';
  const SENTENCE_CHARS = 200;  // the fitted voice's sentence: the transcript's first, at most this long
  // What MediaRecorder is asked for, in order: the first the browser records.
  const RECORDING_TYPES = ['audio/webm;codecs=opus', 'audio/ogg;codecs=opus', 'audio/mp4'];

  let sample = null;     // what Fit sends: {blob, filename}
  let recording = null;  // the microphone while it records
  let fit = null;        // the job followed
  const playerUrls = new Map();

  function setPlayer(player, blob) {
    if (playerUrls.has(player)) URL.revokeObjectURL(playerUrls.get(player));
    playerUrls.delete(player);
    if (blob) {
      playerUrls.set(player, URL.createObjectURL(blob));
      player.src = playerUrls.get(player);
    } else {
      player.removeAttribute('src');
    }
    player.hidden = !blob;
  }

  // MediaRecorder's webm says no length: seeking past its end makes the browser find it, so the
  // sample's player shows its length as the fitted voice's does.
  function findLength() {
    const player = els.sampleAudio;
    if (Number.isFinite(player.duration)) return;
    player.addEventListener('timeupdate', () => { player.currentTime = 0; }, { once: true });
    player.currentTime = Number.MAX_SAFE_INTEGER;
  }

  function setSample(blob, filename) {
    sample = blob ? { blob, filename } : null;
    setPlayer(els.sampleAudio, blob);
    els.sampleNone.hidden = Boolean(blob);
    els.sampleCaption.textContent = blob
      ? `Your sample: ${filename} (${Math.max(1, Math.round(blob.size / 1024))} kB)` : 'Your sample';
  }

  function clearVoiceError() {
    els.voiceError.hidden = true;
    els.voiceError.replaceChildren();
    for (const el of [els.voiceFile, els.voiceName, els.voiceTranscript, els.key]) el.removeAttribute('aria-invalid');
  }

  function showVoiceError(error, status, retryAfter, heading) {
    renderError(els.voiceError, error, status, retryAfter, heading);
    const field = { file: els.voiceFile, name: els.voiceName, transcript: els.voiceTranscript }[error.param] ||
      (status === 401 || status === 403 ? els.key : null);
    if (field) field.setAttribute('aria-invalid', 'true');
    if (status === 401) els.keyField.hidden = false;
  }

  async function showVoiceResponseError(response) {
    const { error, retryAfter } = await responseError(response);
    showVoiceError(error, response.status, retryAfter);
  }

  function fileExtension(type) {
    if (type.includes('webm')) return 'webm';
    if (type.includes('ogg')) return 'ogg';
    if (type.includes('mp4')) return 'm4a';
    return 'audio';
  }

  async function startRecording() {
    clearVoiceError();
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || typeof MediaRecorder === 'undefined') {
      showVoiceError({ message: 'This browser cannot record from this page: a microphone needs HTTPS or localhost. ' +
        'Pick a recording file instead.' }, null, null, 'No microphone');
      return;
    }
    let stream;
    try {
      // the voice as it is: no noise suppression or gain riding to colour it
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
    } catch (e) {
      showVoiceError({ message: `The microphone is not available (${e.name}: ${e.message}). Allow it, or pick a ` +
        'recording file.' }, null, null, 'No microphone');
      return;
    }
    const type = RECORDING_TYPES.find((t) => MediaRecorder.isTypeSupported(t));
    const r = { recorder: new MediaRecorder(stream, type ? { mimeType: type } : undefined), stream, parts: [],
      started: performance.now(), timer: null };
    recording = r;
    r.recorder.ondataavailable = (e) => { if (e.data.size) r.parts.push(e.data); };
    r.recorder.onstop = () => recorded(r);
    r.recorder.start(1000);
    els.record.disabled = els.voiceFile.disabled = true;
    els.recordStop.disabled = false;
    els.recordTime.classList.add('recording');
    r.timer = setInterval(() => {
      const seconds = (performance.now() - r.started) / 1000;
      els.recordTime.textContent = `${seconds.toFixed(1)} s, recording`;
      els.recordTime.dataset.seconds = seconds.toFixed(1);
      if (seconds >= MAX_RECORDING_S) stopRecording();
    }, 100);
    els.recordStop.focus();
  }

  function stopRecording() {
    if (recording && recording.recorder.state !== 'inactive') recording.recorder.stop();
  }

  function recorded(r) {
    clearInterval(r.timer);
    for (const track of r.stream.getTracks()) track.stop();
    recording = null;
    els.record.disabled = els.voiceFile.disabled = false;
    els.recordStop.disabled = true;
    els.recordTime.classList.remove('recording');
    const seconds = (performance.now() - r.started) / 1000;
    els.recordTime.textContent = `${seconds.toFixed(1)} s recorded`;
    els.recordTime.dataset.seconds = seconds.toFixed(1);
    const type = r.recorder.mimeType || (r.parts[0] && r.parts[0].type) || 'audio/webm';
    els.voiceFile.value = '';
    setSample(new Blob(r.parts, { type }), `recording.${fileExtension(type)}`);
    els.fit.focus();
  }

  function pickedFile() {
    clearVoiceError();
    const file = els.voiceFile.files[0];
    if (file) {
      setSample(file, file.name);
      els.recordTime.textContent = '0.0 s';
      els.recordTime.dataset.seconds = '0';
    }
  }

  async function fitVoice(event) {
    event.preventDefault();
    clearVoiceError();
    if (fit && !fit.finished) return;
    if (!sample) {
      showVoiceError({ message: 'Pick a recording file or record one first.', param: 'file' }, null, null, 'No sample');
      return;
    }
    const form = new FormData();  // multipart: the browser writes its boundary into Content-Type
    form.append('file', sample.blob, sample.filename);
    form.append('name', els.voiceName.value.trim());
    const transcript = els.voiceTranscript.value.trim();
    if (transcript) form.append('transcript', transcript);
    els.fit.disabled = true;
    els.fitStatus.textContent = 'Sending the sample…';
    let response;
    try {
      response = await fetch('/v1/audio/voices', { method: 'POST', headers: authHeaders(), body: form });
    } catch (e) {
      showVoiceError({ message: `Cannot reach the server: ${e.message}` });
      els.fit.disabled = false;
      return;
    }
    if (response.status !== 202) {
      await showVoiceResponseError(response);
      els.fitStatus.textContent = 'Not started.';
      els.fit.disabled = false;
      return;
    }
    follow(await response.json(), transcript);
  }

  // Follow a job to its end: its events while the stream holds, then polling.
  async function follow(job, transcript) {
    const f = { id: job.id, name: job.name, transcript, finished: false, source: 'events', controller: new AbortController() };
    fit = f;
    els.fitJob.hidden = false;
    els.fit.disabled = true;
    els.fitCancel.disabled = false;
    setPlayer(els.fittedAudio, null);
    els.useVoice.hidden = els.fitReport.hidden = true;
    els.fittedCaption.textContent = 'The fitted voice';
    els.fittedSaid.textContent = 'Once fitted, it says a sentence here.';
    showJob(f, job);
    try {
      const response = await fetch(`/v1/audio/voices/jobs/${encodeURIComponent(f.id)}/events`,
        { headers: authHeaders(), cache: 'no-store', signal: f.controller.signal });
      if (response.ok && response.body) await readEvents(response.body, (data) => showJob(f, JSON.parse(data)));
    } catch (e) { /* the stream broke (or the job finished and it was closed): polling goes on if need be */ }
    if (!f.finished && fit === f) poll(f);
  }

  // Server-sent events: blocks of `field: value` lines, a blank line after each; their `data` wanted.
  async function readEvents(body, onData) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n/g, '\n');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const data = buffer.slice(0, end).split('\n').filter((line) => line.startsWith('data:'))
          .map((line) => line.slice(5).replace(/^ /, '')).join('\n');
        buffer = buffer.slice(end + 2);
        if (data) onData(data);
      }
    }
  }

  async function poll(f) {
    f.source = 'polling';
    while (!f.finished && fit === f) {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      let response;
      try {
        response = await fetch(`/v1/audio/voices/jobs/${encodeURIComponent(f.id)}`, { headers: authHeaders(), cache: 'no-store' });
      } catch (e) {
        els.fitStatus.textContent = 'Cannot reach the server; still trying…';
        continue;
      }
      if (response.ok) {
        showJob(f, await response.json());
      } else if (response.status !== 503) {  // a 503 (the model reloading) passes: try again
        await showVoiceResponseError(response);
        endFit(f);
        els.fitStatus.textContent = 'Lost track of the fit.';
      }
    }
  }

  function clock(seconds) {
    const s = Math.max(0, Math.round(seconds));
    return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
  }

  function showJob(f, job) {
    if (f !== fit || f.finished) return;
    const p = job.progress || {};
    const phase = FINISHED.includes(job.status) ? job.status : (p.phase || job.status);
    els.fitPhase.textContent = FIT_PHASES[phase] || phase;
    els.fitPhase.dataset.phase = phase;
    els.fitDone.textContent = p.total ? `${p.done} / ${p.total}` : '–';
    if (p.total) {
      els.fitProgress.max = p.total;
      els.fitProgress.value = p.done;
    } else if (job.status !== 'succeeded') {
      els.fitProgress.removeAttribute('value');  // indeterminate until the fit says how much it will hear
    }
    els.fitBest.textContent = typeof p.best_similarity === 'number' ? p.best_similarity.toFixed(3) : '–';
    els.fitEta.textContent = typeof p.eta_s === 'number' && !FINISHED.includes(job.status) ? `about ${clock(p.eta_s)}` : '–';
    Object.assign(els.fitStatus.dataset, { state: job.status, source: f.source, done: String(p.done || 0) });
    if (!FINISHED.includes(job.status)) {
      els.fitStatus.textContent = `Fitting ${job.name}: ${p.message || FIT_PHASES[phase] || phase}…`;
      return;
    }
    endFit(f);
    if (job.status === 'succeeded') {
      fitted(f, job);
    } else if (job.status === 'failed') {
      showVoiceError(job.error || { message: 'The fit failed.' }, null, null, 'The fit failed');
      els.fitStatus.textContent = 'The fit failed: nothing was kept.';
    } else {
      els.fitStatus.textContent = 'Cancelled: nothing was kept.';
    }
  }

  function endFit(f) {
    f.finished = true;
    f.controller.abort();
    els.fitCancel.disabled = true;
    els.fit.disabled = !config.voice_fitting;
  }

  async function cancelFit() {
    const f = fit;
    if (!f || f.finished) return;
    els.fitCancel.disabled = true;
    els.fitStatus.textContent = 'Cancelling…';
    let response;
    try {
      response = await fetch(`/v1/audio/voices/jobs/${encodeURIComponent(f.id)}`, { method: 'DELETE', headers: authHeaders() });
    } catch (e) {
      response = null;
      showVoiceError({ message: `Cannot reach the server: ${e.message}` });
    }
    if (response && !response.ok) await showVoiceResponseError(response);
    if (!response || !response.ok) els.fitCancel.disabled = f.finished;
    // otherwise the job's next state says `cancelled` once its process has stopped
  }

  function firstSentence(text) {
    const sentence = (text.match(/^[\s\S]*?[.!?](?=\s|$)/) || [text])[0].trim();
    return sentence.length > SENTENCE_CHARS ? `${sentence.slice(0, SENTENCE_CHARS).replace(/\s+\S*$/, '')}.` : sentence;
  }

  function reportLine(r) {
    const number = (v) => typeof v === 'number';
    const parts = [];
    if (number(r.similarity)) {
      parts.push(`Similarity to your sample ${r.similarity.toFixed(3)}` + (r.nearest_stock_voice && number(r.nearest_stock_similarity)
        ? `; the nearest stock voice, ${r.nearest_stock_voice}, ${r.nearest_stock_similarity.toFixed(3)}.` : '.'));
    }
    const pitch = r.pitch || {};
    if (pitch.sample && pitch.fitted) parts.push(`Pitch: sample ${pitch.sample.pitch_hz} Hz, fitted ${pitch.fitted.pitch_hz} Hz.`);
    if (number(r.candidates)) {
      parts.push(`${r.candidates} candidates heard` + (number(r.elapsed_s) ? ` in ${clock(r.elapsed_s)}` : '') +
        (r.stopped_at_deadline ? ', stopped at the deadline with the best so far.' : '.'));
    }
    return parts.join(' ');
  }

  async function fitted(f, job) {
    els.fitStatus.textContent = `Fitted ${job.name}.`;
    els.fitReport.textContent = reportLine(job.report || {});
    els.fitReport.hidden = !els.fitReport.textContent;
    // every worker serves it within a second of the file appearing: ask until this one lists it
    for (let tries = 0; tries < 10 && !voices.some((v) => v.id === job.name); tries++) {
      if (tries) await new Promise((resolve) => setTimeout(resolve, 500));
      await reloadVoices();
    }
    const text = firstSentence(f.transcript || '') || FITTED_SAYS;
    els.fittedSaid.textContent = `Synthesizing “${text}”…`;
    let response;
    try {
      response = await fetch('/v1/audio/speech', {
        method: 'POST',
        headers: authHeaders({ 'Content-Type': 'application/json' }),
        body: JSON.stringify({ model: 'kokoro', input: text, voice: job.name, response_format: 'wav', stream: false }),
      });
    } catch (e) {
      showVoiceError({ message: `Cannot reach the server: ${e.message}` });
      return;
    }
    if (!response.ok) {
      await showVoiceResponseError(response);
      els.fittedSaid.textContent = 'It could not say its sentence.';
      return;
    }
    setPlayer(els.fittedAudio, await response.blob());
    els.fittedCaption.textContent = `The fitted voice: ${job.name}`;
    els.fittedSaid.textContent = `Saying “${text}”`;
    els.useVoice.dataset.voice = job.name;
    els.useVoice.hidden = false;
  }

  // The fitted voice alone in the mixer, for the speech form.
  function useFitted() {
    const rows = mixRows();
    if (!rows.length) return;
    for (const row of rows.slice(1)) row.remove();
    relabelRows();
    rows[0].querySelector('select').value = els.useVoice.dataset.voice;
    updateSpec();
    els.text.focus();
  }

  // A fit still running when the page opens (started before a reload, or elsewhere) is followed.
  async function followRunningFit() {
    let response;
    try {
      response = await fetch('/v1/audio/voices/jobs', { headers: authHeaders(), cache: 'no-store' });
    } catch (e) {
      return;
    }
    if (!response.ok) return;
    const running = (await response.json()).data.find((job) => !FINISHED.includes(job.status));
    if (running && !fit) follow(running, '');
  }

  function setUpVoicePanel() {
    els.voiceForm.addEventListener('submit', fitVoice);
    els.voiceFile.addEventListener('change', pickedFile);
    els.sampleAudio.addEventListener('loadedmetadata', findLength);
    els.record.addEventListener('click', startRecording);
    els.recordStop.addEventListener('click', stopRecording);
    els.fitCancel.addEventListener('click', cancelFit);
    els.useVoice.addEventListener('click', useFitted);
    if (!config.voice_fitting) {
      els.voiceUnavailable.textContent = 'This server does not fit voices: its operator sets KOKORO_VOICES_DIR ' +
        '(and KOKORO_VOICE_FIT_JOBS above 0) to allow it.';
      els.voiceUnavailable.hidden = false;
      els.fit.disabled = true;
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
    els.text.addEventListener('input', markPreviewStale);
    els.preview.addEventListener('click', preview);
    els.speed.addEventListener('input', () => { els.speedValue.textContent = `${Number(els.speed.value).toFixed(2)}×`; });
    els.form.addEventListener('submit', (e) => (mode === 'live' ? speakLive(e) : play(e)));
    els.stop.addEventListener('click', () => stop('Stopped.'));
    for (const radio of els.modes) radio.addEventListener('change', () => { if (radio.checked) setMode(radio.value); });
    els.wps.addEventListener('input', () => { els.wpsValue.textContent = `${els.wps.value} words/s`; });
    els.speakLive.addEventListener('click', speakLive);
    els.interrupt.addEventListener('click', interrupt);
    els.liveStop.addEventListener('click', () => stop('Stopped.'));
    els.addNext.addEventListener('click', sayNext);
    els.next.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') {
        e.preventDefault();  // not the form's submit: add the text to the running session
        sayNext();
      }
    });
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
      if (e.key === 'Escape' && session && session.ticker) stop('Stopped.');
    });
    setUpVoicePanel();
    refreshFleet();
    if (!config.api_key_required || els.key.value) {
      await loadVoices();
      if (config.voice_fitting) followRunningFit();
    } else {
      setStatus('Enter the API key to load the voices.');
    }
  }

  start();
})();
