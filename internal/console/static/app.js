// sandboxd's web console: a small app on sandboxd's own API. No framework
// and no build step; the server embeds this file as it is.
//
// Rules kept throughout:
// - The account key lives in sessionStorage only (this tab, until it closes
//   or the user signs out); it is sent in the x-api-key header, and to the
//   terminal's websocket as its sandboxd.key.<KEY> subprotocol: never in a
//   URL, a cookie or the local storage that outlives the tab.
// - Everything from the API or a repository is rendered with textContent
//   or as text nodes, never parsed as HTML; previews of binary files are
//   blob URLs with the type their extension names.
// - Fields a newer server adds (a sandbox's failureReason, a run's
//   sandboxId, the health's degraded) are read when present and their
//   absence is an older server, not an error.
'use strict';

(() => {
  const KEY_STORAGE = 'sandboxd.key';
  const REFRESH_MS = 5000;
  const HEALTH_MS = 15000;
  const LOG_KEEP_CHARS = 2 << 20; // a run's log in the page: its last 2 MiB of text
  const BUILD_POLL_MS = 1000; // a building template's detail looks again this often
  const TERM_KEEP_CHARS = 512 << 10;
  const HIGHLIGHT_MAX_CHARS = 512 << 10; // larger files are shown plain
  const MAX_PAGES = 100; // "every page" of the sandboxes: at most this many requests

  const $ = (id) => document.getElementById(id);

  const state = {
    key: sessionStorage.getItem(KEY_STORAGE),
    view: null,
    arg: '',
    refreshTimer: null,
    sandboxes: [], // the last list, filtered in the page
    sandbox: null, // the sandbox the detail view shows
    exec: null, // AbortController of the detail view's command
    code: { contexts: {}, run: null, urls: [] }, // the notebook's contexts by language, its running cell, its images
    runs: [], // the runs listed, newest first
    runsCursor: null, // X-Next-Cursor of the last page of runs listed
    runStream: null, // AbortController of the followed run log
    openRun: null,
    openFile: null,
    previewURL: null, // blob URL of the file preview, revoked on change
    ws: null,
    termText: '',
    termNode: document.createTextNode(''),
    termCursor: null,
    template: null, // the template the detail view shows
    templateTimer: null, // the detail's next look while it builds
    templateChoices: '', // the ready templates the create form offers, as last listed
    createTemplate: '', // the template to choose in the create form when it shows
    volumeChoices: '', // the volumes the create form offers, as last listed
    createVolume: '', // the volume to choose in the create form when it shows
    volumeDelete: null, // the name of the volume whose delete waits for a yes
  };

  // ---- small DOM helpers -------------------------------------------------

  // el builds an element; children that are not nodes become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else if (k === 'dataset') Object.assign(e.dataset, v);
        else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
        else e[k] = v;
      }
    }
    for (const c of children) {
      if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // link is an in-page link to a hash route, which does not also click the
  // row it sits in.
  function link(hash, text, cls) {
    return el('a', { href: hash, text, class: cls || '', onclick: (e) => e.stopPropagation() });
  }

  function flash(msg) {
    const f = $('flash');
    f.textContent = msg || '';
    f.hidden = !msg;
  }

  // say shows a message in a form's own error line (none: hides it).
  function say(id, msg) {
    $(id).textContent = msg || '';
    $(id).hidden = !msg;
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined || ms < 0) return '—';
    const s = Math.floor(ms / 1000);
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${String(s % 60).padStart(2, '0')}s`;
    const h = Math.floor(m / 60);
    return `${h}h ${String(m % 60).padStart(2, '0')}m`;
  }

  // fmtMinutes says a number of milliseconds in minutes: "1440 minutes".
  function fmtMinutes(ms) {
    const m = ms / 60000;
    const s = Number.isInteger(m) ? String(m) : m.toFixed(2).replace(/\.?0+$/, '');
    return `${s} minute${s === '1' ? '' : 's'}`;
  }

  // inMinutes rewrites the API's timeouts in milliseconds ("timeout must be
  // at most 86400000 ms") in the minutes the console asks for.
  function inMinutes(msg) {
    return String(msg)
      .replace(/(\d+)\s*(?:ms|milliseconds)\b/g, (_, n) => fmtMinutes(Number(n)))
      .replace(/\bmilliseconds\b/g, 'minutes');
  }

  // minutesField reads a field of minutes as milliseconds: undefined when
  // it is empty (the server's default), an error when it is not a positive
  // number.
  function minutesField(id, what) {
    const raw = $(id).value.trim();
    if (raw === '') return undefined;
    const m = Number(raw);
    if (!Number.isFinite(m) || m <= 0) throw new Error(`${what} must be a positive number of minutes`);
    return Math.max(1, Math.round(m * 60000));
  }

  function fmtTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString();
  }

  // fmtShort is a time of today as a time of day, another as a date.
  function fmtShort(iso) {
    const d = new Date(iso);
    if (!iso || isNaN(d)) return '—';
    return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleDateString();
  }

  function fmtBytes(n) {
    if (typeof n !== 'number') return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  }

  // shellJoin shows a command line with its arguments quoted where a shell
  // would need it.
  function shellJoin(words) {
    return words.map((w) => {
      w = String(w);
      return w !== '' && /^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`;
    }).join(' ');
  }

  function statusBadge(status) {
    return el('span', { class: 'badge st-' + String(status).toLowerCase(), text: status });
  }

  // policyText says a network policy: none, egress, or its allow list.
  function policyText(p) {
    if (p === undefined || p === null) return 'none';
    if (typeof p === 'string') return p;
    if (p && Array.isArray(p.allow)) return p.allow.length ? 'allow: ' + p.allow.join(', ') : 'allow: (nothing)';
    return JSON.stringify(p);
  }

  // policyOf builds a policy from a kind select and an allow list input.
  function policyOf(kindId, allowId) {
    const kind = $(kindId).value;
    if (kind !== 'allow') return kind;
    return { allow: $(allowId).value.split(/[\s,]+/).filter(Boolean) };
  }

  // ---- the API -------------------------------------------------------------

  class APIError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // request calls the API with the key; it answers the decoded body and the
  // response (for its headers), or throws an APIError with the API's
  // message. body is JSON, or a FormData sent as multipart.
  async function request(method, path, body) {
    const headers = { 'x-api-key': state.key };
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body instanceof FormData) {
      init.body = body;
    } else if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!resp.ok) {
      const msg = (data && (data.error || data.message)) || `HTTP ${resp.status}`;
      // A stored key that stopped working (revoked, expired) signs out;
      // a key being tried at sign-in is not stored yet.
      if (resp.status === 401 && sessionStorage.getItem(KEY_STORAGE)) signOut('The server refused the key: sign in again.');
      throw new APIError(resp.status, msg);
    }
    return { data, resp };
  }

  async function api(method, path, body) {
    return (await request(method, path, body)).data;
  }

  const sbPath = (id, rest) => `/api/sandboxes/${encodeURIComponent(id)}${rest || ''}`;

  // readEvents reads a text/event-stream body, calling onEvent(name, data)
  // for each event (fetch, not EventSource: EventSource cannot send the key).
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n?/g, '\n');
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (field === 'event') name = val;
          else if (field === 'data') data.push(val);
        }
        if (data.length) onEvent(name, data.join('\n'));
      }
    }
  }

  // stripEscapes drops terminal escape sequences (colours, cursor moves,
  // titles) that a <pre> cannot draw.
  function stripEscapes(s) {
    return s
      .replace(/\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?/g, '')
      .replace(/\x1b\[[0-?]*[ -/]*[@-~]/g, '')
      .replace(/\x1b[()][0-9A-Za-z]/g, '')
      .replace(/\x1b[@-Z\\-_=>]/g, '');
  }

  // appendOut adds text to a <pre> (a span of class cls when given),
  // keeping its last LOG_KEEP_CHARS, and follows its end.
  function appendOut(pre, text, cls) {
    const t = stripEscapes(text);
    pre.append(cls ? el('span', { class: cls, text: t }) : document.createTextNode(t));
    let total = pre.textContent.length;
    while (total > LOG_KEEP_CHARS && pre.firstChild) {
      total -= pre.firstChild.textContent.length;
      pre.firstChild.remove();
    }
    pre.scrollTop = pre.scrollHeight;
  }

  // ---- the server's health: a banner while it says it is degraded --------

  async function checkHealth() {
    let data = null;
    try {
      // No key: the health is public.
      const resp = await fetch('/api/health', { cache: 'no-store', credentials: 'omit' });
      data = await resp.json();
    } catch (e) {
      return; // unreachable: the calls the view makes say so
    }
    // An older server sends no degraded field: healthy as far as it says.
    const reasons = data && Array.isArray(data.degraded) ? data.degraded : [];
    const items = reasons.map((r) => el('li', { text: typeof r === 'string' ? r : JSON.stringify(r) }));
    $('health-reasons').replaceChildren(...items);
    $('health').hidden = items.length === 0;
  }

  // ---- signing in and out ----------------------------------------------------

  async function signIn(ev) {
    ev.preventDefault();
    const key = $('key').value.trim();
    $('signin-error').textContent = '';
    if (!key) return;
    state.key = key;
    try {
      await api('GET', '/api/tasks/runs?limit=1');
    } catch (e) {
      state.key = null;
      $('signin-error').textContent = e.status === 401 ? 'That key was refused.' : `Could not sign in: ${e.message}`;
      return;
    }
    sessionStorage.setItem(KEY_STORAGE, key);
    $('key').value = '';
    if (!location.hash || location.hash === '#signin') location.hash = '#sandboxes';
    else route();
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = null;
    stopRunStream();
    stopExec();
    disconnectTerminal();
    clearPreview();
    for (const id of ['sandboxes-body', 'runs-body', 'tree', 'preview-body', 'snapshots-body', 'run-log',
      'sb-fields', 'exec-output', 'procs-body', 'fork-result', 'snapshot-result', 'events-body', 'templates-body', 'tpl-fields', 'tpl-log',
      'volumes-body']) $(id).replaceChildren();
    state.template = null;
    state.templateChoices = '';
    state.createTemplate = '';
    state.volumeChoices = '';
    state.createVolume = '';
    state.volumeDelete = null;
    $('vol-confirm').hidden = true;
    $('new-volume').replaceChildren(el('option', { value: '', text: 'none' }));
    $('new-volume-row').hidden = true;
    state.sandboxes = [];
    state.sandbox = null;
    state.runs = [];
    state.runsCursor = null;
    $('run-detail').hidden = true;
    $('preview').hidden = true;
    state.termText = '';
    state.termNode.data = '';
    flash('');
    history.replaceState(null, '', location.pathname);
    route();
    if (message) $('signin-error').textContent = message;
  }

  // ---- routing: #view or #view/argument ------------------------------------

  const views = {
    sandboxes: { load: loadSandboxes, refresh: true },
    sandbox: { load: (arg, refreshing) => loadSandbox(arg, refreshing), refresh: true, nav: 'sandboxes' },
    runs: { load: (arg, refreshing) => loadRuns(arg, refreshing), refresh: true },
    files: { load: (arg) => loadFiles(arg) },
    snapshots: { load: loadSnapshots, refresh: true },
    templates: { load: loadTemplates, refresh: true },
    // The detail looks again by itself, faster while it builds.
    template: { load: (arg) => loadTemplate(arg), nav: 'templates' },
    volumes: { load: (arg, refreshing) => loadVolumes(arg, refreshing), refresh: true },
    terminal: { load: (arg) => loadTerminal(arg) },
  };

  function route() {
    clearInterval(state.refreshTimer);
    clearTimeout(state.templateTimer);
    run(checkHealth());
    const signedIn = !!state.key;
    $('nav').hidden = !signedIn;
    $('signout').hidden = !signedIn;
    const hash = decodeURIComponent(location.hash.slice(1));
    const slash = hash.indexOf('/');
    let name = slash < 0 ? hash : hash.slice(0, slash);
    const arg = slash < 0 ? '' : hash.slice(slash + 1);
    if (!signedIn) name = 'signin';
    else if (!views[name]) name = 'sandboxes';
    if (name !== 'runs') stopRunStream();
    if (name !== 'sandbox' || arg !== state.arg) leaveSandbox();
    if (name !== 'template') state.template = null;
    for (const s of document.querySelectorAll('main > .view')) s.hidden = s.id !== 'view-' + name;
    const nav = (views[name] && views[name].nav) || name;
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === nav);
    state.view = name;
    state.arg = arg;
    flash('');
    if (name === 'signin') { $('key').focus(); return; }
    const v = views[name];
    run(v.load(arg));
    if (v.refresh) {
      state.refreshTimer = setInterval(() => { if (!document.hidden) run(v.load(arg, true)); }, REFRESH_MS);
    }
  }

  // run reports a failed promise in the page.
  function run(p) {
    Promise.resolve(p).catch((e) => { if (state.key) flash(e.message || String(e)); });
  }

  // busy disables a button while the action it started is under way.
  async function busy(id, fn) {
    const b = $(id);
    b.disabled = true;
    try {
      return await fn();
    } finally {
      b.disabled = false;
    }
  }

  // ---- sandboxes -------------------------------------------------------------

  const ACTIVE = new Set(['pending', 'running', 'stopping', 'pausing', 'paused', 'resuming']);

  // remainingOf is a span with the time a sandbox has left: counted down
  // while it runs (tickDeadlines), kept while it is paused.
  function remainingOf(sb, now) {
    const span = el('span', { class: 'remaining' });
    if (sb.sandboxStatus === 'running' && typeof sb.timeout === 'number') span.dataset.deadline = String(now + sb.timeout);
    else span.textContent = sb.sandboxStatus === 'paused' ? `${fmtDuration(sb.timeout)} (paused)` : '—';
    return span;
  }

  // failureOf is the reason a failed sandbox gives (failureReason; an older
  // server gives none).
  function failureOf(sb) {
    return typeof sb.failureReason === 'string' ? sb.failureReason : '';
  }

  async function loadSandboxes(arg, refreshing) {
    let list;
    if ($('sb-all').checked) {
      // Every page is many requests: refreshed every 30 s, not 5.
      if (refreshing && Date.now() - (state.allAt || 0) < 30000) return;
      state.allAt = Date.now();
      // Every page, as `sandbox ls --all` reads them.
      list = [];
      let cursor = '';
      for (let i = 0; i < MAX_PAGES; i++) {
        const { data, resp } = await request('GET', '/api/sandboxes?limit=100' + (cursor ? '&cursor=' + encodeURIComponent(cursor) : ''));
        list.push(...(data.sandboxes || []));
        cursor = resp.headers.get('X-Next-Cursor');
        if (!cursor) break;
      }
    } else {
      list = (await api('GET', '/api/sandboxes')).sandboxes || [];
    }
    state.sandboxes = list;
    renderSandboxes();
    await Promise.all([loadTemplateChoices(), loadVolumeChoices()]);
  }

  function renderSandboxes() {
    const status = $('sb-filter-status').value;
    const text = $('sb-filter-text').value.trim().toLowerCase();
    const now = Date.now();
    const shown = state.sandboxes.filter((sb) =>
      (!status || (status === 'active' ? ACTIVE.has(sb.sandboxStatus) : sb.sandboxStatus === status)) &&
      (!text || String(sb.sandboxId).toLowerCase().includes(text)));
    const rows = shown.map((sb) => {
      const open = () => { location.hash = '#sandbox/' + encodeURIComponent(sb.sandboxId); };
      const statusCell = el('td', null, statusBadge(sb.sandboxStatus));
      const reason = failureOf(sb);
      if (reason) statusCell.append(el('span', { class: 'reason', text: reason }));
      return el('tr', { class: 'clickable', dataset: { sandbox: sb.sandboxId, status: sb.sandboxStatus }, onclick: open },
        el('td', { class: 'mono' }, link('#sandbox/' + encodeURIComponent(sb.sandboxId), sb.sandboxId, 'sandbox-link')),
        statusCell,
        el('td', null, remainingOf(sb, now)),
        el('td', { class: 'opt', text: fmtTime(sb.createdAt) }),
        el('td', { class: 'opt', text: sb.runtime || '' }),
        el('td', { class: 'opt mono' }, sb.runId ? link('#runs/' + encodeURIComponent(sb.runId), sb.runId) : null));
    });
    $('sandboxes-body').replaceChildren(...rows);
    $('sandboxes-empty').hidden = rows.length > 0;
    $('sandboxes-empty').textContent = state.sandboxes.length ? 'No sandbox matches the filter.' : 'No sandboxes yet.';
    $('sb-count').textContent = shown.length === state.sandboxes.length ? `${shown.length}` : `${shown.length} of ${state.sandboxes.length}`;
    tickDeadlines();
  }

  // tickDeadlines counts the remaining time of running sandboxes down.
  function tickDeadlines() {
    const now = Date.now();
    let expired = false;
    for (const span of document.querySelectorAll('[data-deadline]')) {
      const left = Number(span.dataset.deadline) - now;
      span.textContent = fmtDuration(Math.max(0, left));
      span.classList.toggle('soon', left < 60000);
      if (left <= 0) expired = true;
    }
    if (expired && (state.view === 'sandboxes' || state.view === 'sandbox') && !state.reloadPending) {
      state.reloadPending = true;
      setTimeout(() => {
        state.reloadPending = false;
        if (state.view === 'sandboxes') run(loadSandboxes());
        else if (state.view === 'sandbox') run(loadSandbox(state.arg, true));
      }, 1500);
    }
  }

  async function createSandbox(ev) {
    ev.preventDefault();
    say('create-error', '');
    const kind = $('new-kind').value;
    const text = $('new-command').value.trim();
    const body = {};
    try {
      const timeout = minutesField('new-timeout', 'The timeout');
      if (timeout !== undefined) body.timeout = timeout;
    } catch (e) {
      say('create-error', e.message);
      return;
    }
    if (kind === 'command' && text) {
      body.command = 'sh';
      body.args = ['-c', text];
      const cwd = $('new-cwd').value.trim();
      if (cwd) body.cwd = cwd;
    }
    if (kind === 'prompt' && text) body.prompt = text;
    if ($('new-network').value !== 'none') body.network = policyOf('new-network', 'new-allow');
    if ($('new-template').value) body.template = $('new-template').value;
    if ($('new-volume').value) {
      const mount = { name: $('new-volume').value, path: $('new-volume-path').value.trim() || '/data' };
      if ($('new-volume-ro').checked) mount.read_only = true;
      body.volumes = [mount];
    }
    await busy('create', async () => {
      let data;
      try {
        data = await api('POST', '/api/sandboxes', body);
      } catch (e) {
        say('create-error', inMinutes(e.message));
        return;
      }
      const sb = (data.sandboxes || [])[0];
      $('new-command').value = '';
      // A volume read-write is one sandbox's at a time: the next create
      // chooses again.
      $('new-volume').value = '';
      volumeChoiceChanged();
      if (sb && sb.runId) location.hash = '#runs/' + encodeURIComponent(sb.runId);
      else if (sb) location.hash = '#sandbox/' + encodeURIComponent(sb.sandboxId);
      else await loadSandboxes();
    });
  }

  function createKindChanged() {
    const kind = $('new-kind').value;
    $('new-command').disabled = kind === 'none';
    $('new-command').placeholder = kind === 'prompt' ? 'create a hello world index.html' : 'echo hello > hello.txt';
    $('new-cwd').hidden = kind !== 'command';
  }

  // ---- one sandbox: every field, and everything that can be done to it -----

  const FIELD_LABELS = {
    sandboxId: 'Id', sandboxStatus: 'Status', failureReason: 'Failure reason', timeout: 'Time left',
    createdAt: 'Created', runId: 'Run', runtime: 'Runtime', network: 'Network',
    network_bytes: 'Network traffic', forkedFrom: 'Forked from',
    pausedFiles: 'Paused with', onTimeout: 'At its timeout',
  };

  // fieldValue renders one field of a sandbox as text (or links).
  function fieldValue(sb, k, now) {
    const v = sb[k];
    switch (k) {
      case 'timeout': {
        if (sb.sandboxStatus === 'running') return el('span', null, remainingOf(sb, now), ' of its timeout');
        if (sb.sandboxStatus === 'paused') return `${fmtDuration(v)}, kept while paused`;
        return typeof v === 'number' && v > 0 ? fmtDuration(v) : '—';
      }
      case 'createdAt': return fmtTime(v);
      case 'runId': return v ? link('#runs/' + encodeURIComponent(v), v, 'mono') : '—';
      case 'forkedFrom': return v ? link('#sandbox/' + encodeURIComponent(v), v, 'mono') : '—';
      case 'network': return policyText(v);
      case 'network_bytes': return v && typeof v === 'object' ? `sent ${fmtBytes(v.sent)}, received ${fmtBytes(v.received)}` : JSON.stringify(v);
      case 'sandboxStatus': return statusBadge(v);
      case 'pausedFiles': return v ? 'its files alone (its processes start afresh at the resume)' : 'its memory';
      case 'onTimeout': return v === 'pause-files' ? 'pauses with its files alone' : v === 'pause' ? 'pauses with its memory' : 'stops';
    }
    if (v === null || v === undefined) return '—';
    return typeof v === 'string' ? v : JSON.stringify(v);
  }

  async function loadSandbox(id, refreshing) {
    if (!refreshing) {
      state.sandbox = null;
      $('sb-title').textContent = id;
      $('sb-badge').replaceChildren();
      $('sb-fields').replaceChildren();
      $('sb-failure').hidden = true;
      $('sb-live').hidden = true;
      for (const b of $('sb-buttons').querySelectorAll('button')) b.disabled = true;
      say('sb-error', '');
    }
    const data = await api('GET', '/api/sandboxes?sandbox_id=' + encodeURIComponent(id));
    if (state.view !== 'sandbox' || state.arg !== id) return;
    const sb = (data.sandboxes || []).find((s) => s.sandboxId === id);
    if (!sb) {
      state.sandbox = null;
      $('sb-fields').replaceChildren();
      say('sb-error', 'No such sandbox: it is not this account\'s, or it ended long enough ago to be deleted.');
      return;
    }
    const first = !state.sandbox;
    renderSandbox(sb);
    run(loadEvents(id));
    if (first) {
      // The network form starts from the policy it has.
      const p = sb.network;
      $('sb-network-kind').value = p && typeof p === 'object' ? 'allow' : (p || 'none');
      $('sb-network-allow').value = p && Array.isArray(p.allow) ? p.allow.join(', ') : '';
      networkKindChanged();
      if (sb.sandboxStatus === 'running') run(loadProcesses());
    }
  }

  // loadEvents lists the open sandbox's lifecycle events, newest first.
  async function loadEvents(id) {
    const data = await api('GET', '/api/events?limit=50&sandbox_id=' + encodeURIComponent(id));
    if (state.view !== 'sandbox' || state.arg !== id) return;
    const events = data.events || [];
    $('events-table').hidden = events.length === 0;
    $('events-note').textContent = events.length ? 'What happened to it, newest first.' : 'No events recorded.';
    $('events-body').replaceChildren(...events.map((e) => {
      const details = Object.entries(e.data || {}).map(([k, v]) => k + ': ' + (typeof v === 'object' ? JSON.stringify(v) : v)).join(', ');
      return el('tr', { dataset: { event: e.type } }, el('td', { text: new Date(e.created_at).toLocaleString() }),
        el('td', { text: e.type }), el('td', { class: 'opt', text: details }));
    }));
  }

  function renderSandbox(sb) {
    state.sandbox = sb;
    const now = Date.now();
    $('sb-title').textContent = sb.sandboxId;
    $('sb-badge').replaceChildren(statusBadge(sb.sandboxStatus));
    $('view-sandbox').dataset.status = sb.sandboxStatus;
    const failed = sb.sandboxStatus === 'failed';
    $('sb-failure').hidden = !failed;
    $('sb-failure').textContent = failed
      ? (failureOf(sb) ? 'It failed: ' + failureOf(sb) : 'It failed; the server gives no reason.')
      : '';
    const keys = Object.keys(FIELD_LABELS).filter((k) => k in sb);
    for (const k of Object.keys(sb)) if (!keys.includes(k)) keys.push(k);
    $('sb-fields').replaceChildren(...keys.map((k) =>
      el('div', { dataset: { field: k } }, el('dt', { text: FIELD_LABELS[k] || k }), el('dd', null, fieldValue(sb, k, now)))));
    $('sb-run').hidden = !sb.runId;
    $('sb-live').hidden = !ACTIVE.has(sb.sandboxStatus);
    updateActions(sb);
    tickDeadlines();
  }

  // updateActions enables what can be done to the sandbox as it is now.
  function updateActions(sb) {
    const st = sb.sandboxStatus;
    const live = st === 'running' || st === 'paused';
    const on = {
      'sb-stop': live || st === 'pending',
      'sb-pause': st === 'running',
      'sb-pause-files': st === 'running',
      'sb-resume': st === 'paused',
      'sb-terminal': st === 'running',
      'sb-run': !!sb.runId,
      'sb-extend': live,
      'sb-fork': live,
      'sb-snapshot': live,
      'sb-network-apply': st === 'running' && 'network' in sb,
      'exec-run': live && !state.exec,
      'procs-refresh': live,
    };
    for (const [id, enabled] of Object.entries(on)) if (!$(id).dataset.busy) $(id).disabled = !enabled;
    $('sb-network-note').textContent = 'network' in sb
      ? 'Replaces its policy at once, without a restart.'
      : 'It was created without a network, so it cannot be given one.';
  }

  // act runs an action on the open sandbox from button id: its button is
  // busy meanwhile, its error shown (timeouts in minutes), the sandbox
  // shown again after.
  async function act(id, fn) {
    const sb = state.sandbox;
    if (!sb) return;
    say('sb-error', '');
    const b = $(id);
    b.dataset.busy = '1';
    b.disabled = true;
    try {
      await fn(sb);
    } catch (e) {
      say('sb-error', inMinutes(e.message || String(e)));
    } finally {
      delete b.dataset.busy;
      if (state.view === 'sandbox' && state.arg === sb.sandboxId) {
        await loadSandbox(sb.sandboxId, true).catch((e) => say('sb-error', e.message));
      }
    }
  }

  // leftNow is the open sandbox's remaining time now, in milliseconds.
  function leftNow(sb) {
    const span = document.querySelector('#sb-fields [data-deadline]');
    if (sb.sandboxStatus === 'running' && span) return Math.max(0, Number(span.dataset.deadline) - Date.now());
    return typeof sb.timeout === 'number' ? sb.timeout : 0;
  }

  function sandboxAction(verb) {
    return () => act('sb-' + verb, (sb) => api('POST', sbPath(sb.sandboxId, '/' + verb), {}));
  }

  function extendSandbox(ev) {
    ev.preventDefault();
    run(act('sb-extend', async (sb) => {
      const add = minutesField('sb-extend-minutes', 'The extension');
      if (add === undefined) throw new Error('Say how many minutes to add.');
      await api('POST', sbPath(sb.sandboxId, '/timeout'), { timeout: Math.round(leftNow(sb) + add) });
    }));
  }

  function forkSandbox(ev) {
    ev.preventDefault();
    run(act('sb-fork', async (sb) => {
      const count = Number($('sb-fork-count').value || '1');
      if (!Number.isInteger(count) || count < 1) throw new Error('The count must be a whole number, 1 or more.');
      const body = { count };
      const timeout = minutesField('sb-fork-timeout', 'The timeout');
      if (timeout !== undefined) body.timeout = timeout;
      const data = await api('POST', sbPath(sb.sandboxId, '/fork'), body);
      $('fork-result').replaceChildren(el('li', { text: 'Started:' }),
        ...(data.sandboxes || []).map((c) => el('li', { dataset: { forked: c.sandboxId } }, link('#sandbox/' + encodeURIComponent(c.sandboxId), c.sandboxId, 'mono'))));
    }));
  }

  // snapshotSandbox saves the open sandbox's files as a named snapshot,
  // and offers to start a sandbox from it.
  function snapshotSandbox(ev) {
    ev.preventDefault();
    run(act('sb-snapshot', async (sb) => {
      const name = $('sb-snapshot-name').value.trim();
      const data = await api('POST', sbPath(sb.sandboxId, '/snapshots'), name ? { name } : {});
      const snap = data.snapshot;
      const start = el('button', { type: 'button', text: 'Start a sandbox from it' });
      start.addEventListener('click', () => run((async () => {
        start.disabled = true;
        const made = await api('POST', '/api/sandboxes', { snapshot: snap.id });
        const child = (made.sandboxes || [])[0];
        if (child) location.hash = '#sandbox/' + encodeURIComponent(child.sandboxId);
      })()));
      $('snapshot-result').replaceChildren(el('li', { text: 'Saved:' }),
        el('li', { dataset: { snapshot: snap.ref } }, el('span', { text: snap.ref, class: 'mono' })), el('li', {}, start));
    }));
  }

  function setNetwork(ev) {
    ev.preventDefault();
    run(act('sb-network-apply', (sb) => api('PATCH', sbPath(sb.sandboxId, '/network'), { network: policyOf('sb-network-kind', 'sb-network-allow') })));
  }

  function networkKindChanged() {
    $('sb-network-allow').hidden = $('sb-network-kind').value !== 'allow';
  }

  // leaveSandbox forgets the open sandbox: its command is stopped (it was
  // started to be watched here), its forms emptied.
  function leaveSandbox() {
    stopExec();
    resetCode();
    state.sandbox = null;
    $('exec-output').replaceChildren();
    $('exec-output').hidden = true;
    $('exec-status').textContent = '';
    $('fork-result').replaceChildren();
    $('procs-body').replaceChildren();
    $('procs-table').hidden = true;
  }

  // ---- exec: a command in the open sandbox, its output streamed ------------

  function stopExec() {
    if (state.exec) state.exec.abort();
    state.exec = null;
    $('exec-stop').disabled = true;
  }

  async function execCommand(ev) {
    ev.preventDefault();
    const sb = state.sandbox;
    const command = $('exec-command').value;
    if (!sb || !command.trim() || state.exec) return;
    const ctrl = new AbortController();
    state.exec = ctrl;
    const out = $('exec-output');
    const status = $('exec-status');
    out.replaceChildren();
    out.hidden = false;
    status.textContent = 'running…';
    status.className = 'note';
    delete status.dataset.exit;
    $('exec-run').disabled = true;
    $('exec-stop').disabled = false;
    const done = (text, cls, code) => {
      status.textContent = text;
      status.className = cls;
      if (code !== undefined) status.dataset.exit = String(code);
    };
    try {
      // killOnDisconnect: Stop (or leaving the page) ends the command, as
      // Ctrl-C does in `sandboxd sandbox exec`.
      const resp = await fetch(sbPath(sb.sandboxId, '/exec'), {
        method: 'POST',
        headers: { 'x-api-key': state.key, 'Content-Type': 'application/json', Accept: 'text/event-stream' },
        body: JSON.stringify({ command: 'sh', args: ['-c', command], killOnDisconnect: true }),
        cache: 'no-store', credentials: 'omit', signal: ctrl.signal,
      });
      if (!resp.ok) {
        let msg = `HTTP ${resp.status}`;
        try { const d = await resp.json(); msg = d.error || d.message || msg; } catch (e) { /* not JSON */ }
        done(msg, 'error');
        return;
      }
      let ended = false;
      await readEvents(resp.body, (name, raw) => {
        let msg = {};
        try { msg = JSON.parse(raw); } catch (e) { return; }
        if (name === 'stdout') appendOut(out, msg.data || '');
        else if (name === 'stderr') appendOut(out, msg.data || '', 'stderr');
        else if (name === 'exit') {
          ended = true;
          const ms = Number(msg.durationMs);
          const parts = [`exit ${msg.exitCode}`, ms < 1000 ? `${ms} ms` : fmtDuration(ms)];
          if (msg.oomKilled) parts.push('killed for the memory limit');
          done(parts.join(' · '), msg.exitCode === 0 ? 'status st-completed' : 'status st-failed', msg.exitCode);
        } else if (name === 'error') {
          ended = true;
          done(msg.error || 'the command failed', 'error');
        }
      });
      if (!ended) done('the stream ended before the command did', 'error');
    } catch (e) {
      if (ctrl.signal.aborted) done('stopped', 'note');
      else done(`the stream broke: ${e.message}`, 'error');
    } finally {
      if (state.exec === ctrl) state.exec = null;
      $('exec-stop').disabled = true;
      if (state.sandbox) updateActions(state.sandbox);
    }
  }

  // ---- code: a notebook on the open sandbox's code interpreter -------------

  // The cells of one language run in one context (a kernel), made on the
  // first cell; a result's images become blobs (the page's policy allows
  // no data: URLs), its DataFrame a table; its HTML is not rendered (it
  // comes from the sandbox), its text is.
  function resetCode() {
    if (state.code && state.code.run) state.code.run.abort();
    for (const u of (state.code && state.code.urls) || []) URL.revokeObjectURL(u);
    state.code = { contexts: {}, run: null, urls: [] };
    $('code-cells').replaceChildren();
    $('code-status').textContent = '';
    $('code-restart').disabled = true;
    $('code-stop').disabled = true;
  }

  async function codeContext(sb, language) {
    let id = state.code.contexts[language];
    if (!id) {
      $('code-status').textContent = `starting a ${language} kernel…`;
      const d = await api('POST', sbPath(sb.sandboxId, '/code/contexts'), { language });
      id = d.context.id;
      state.code.contexts[language] = id;
    }
    $('code-restart').disabled = false;
    return id;
  }

  function dataTable(data) {
    const cols = Object.keys(data);
    const rows = cols.length ? data[cols[0]].length : 0;
    const head = el('tr', null, ...cols.map((c) => el('th', { text: c })));
    const body = [];
    for (let i = 0; i < Math.min(rows, 200); i++) {
      body.push(el('tr', null, ...cols.map((c) => el('td', { text: data[c][i] === null ? '' : String(data[c][i]) }))));
    }
    const t = el('table', { class: 'code-table' }, el('thead', null, head), el('tbody', null, ...body));
    return rows > 200 ? el('div', null, t, el('p', { class: 'note', text: `${rows - 200} more rows not shown` })) : t;
  }

  function codeResult(out, r) {
    const images = [['png', 'image/png', true], ['jpeg', 'image/jpeg', true], ['svg', 'image/svg+xml', false]];
    let shown = false;
    for (const [field, type, b64] of images) {
      if (typeof r[field] !== 'string') continue;
      const bytes = b64 ? base64Bytes(r[field]) : new TextEncoder().encode(r[field]);
      const url = URL.createObjectURL(new Blob([bytes], { type }));
      state.code.urls.push(url);
      out.append(el('img', { class: 'code-image', src: url, alt: field + ' result' }));
      shown = true;
    }
    if (!shown && r.data && typeof r.data === 'object') {
      out.append(dataTable(r.data));
      shown = true;
    }
    if (!shown && typeof r.text === 'string') out.append(el('pre', { class: 'code-text', text: r.text }));
  }

  async function runCell(ev) {
    ev.preventDefault();
    const sb = state.sandbox;
    const code = $('code-input').value;
    if (!sb || !code.trim() || state.code.run) return;
    // Another sandbox's page: its contexts are not this one's.
    if (state.code.sandboxId !== sb.sandboxId) {
      resetCode();
      state.code.sandboxId = sb.sandboxId;
    }
    const language = $('code-language').value;
    const status = $('code-status');
    const count = el('span', { class: 'code-count', text: '[ ]' });
    const out = el('div', { class: 'code-out' });
    const stream = el('pre', { class: 'log code-stream', hidden: true });
    out.append(stream);
    const cell = el('div', { class: 'code-cell', dataset: { language } },
      el('div', { class: 'row' }, count, el('pre', { class: 'code-in', text: code })), out);
    $('code-cells').append(cell);
    const ctrl = new AbortController();
    state.code.run = ctrl;
    $('code-run').disabled = true;
    $('code-stop').disabled = false;
    try {
      const contextId = await codeContext(sb, language);
      status.textContent = 'running…';
      const resp = await fetch(sbPath(sb.sandboxId, '/code'), {
        method: 'POST',
        headers: { 'x-api-key': state.key, 'Content-Type': 'application/json', Accept: 'text/event-stream' },
        body: JSON.stringify({ code, contextId }),
        cache: 'no-store', credentials: 'omit', signal: ctrl.signal,
      });
      if (!resp.ok) {
        let msg = `HTTP ${resp.status}`;
        try { const d = await resp.json(); msg = d.error || msg; } catch (e) { /* not JSON */ }
        if (resp.status === 404) delete state.code.contexts[language];
        throw new Error(msg);
      }
      let ended = false;
      await readEvents(resp.body, (name, raw) => {
        let msg = {};
        try { msg = JSON.parse(raw); } catch (e) { return; }
        if (name === 'number_of_executions') count.textContent = `[${msg.execution_count}]`;
        else if (name === 'stdout' || name === 'stderr') {
          stream.hidden = false;
          appendOut(stream, msg.text || '', name === 'stderr' ? 'stderr' : undefined);
        } else if (name === 'result') codeResult(out, msg);
        else if (name === 'error') {
          out.append(el('pre', { class: 'code-error stderr', text: `${msg.name}: ${msg.value}\n${stripEscapes(msg.traceback || '')}` }));
          cell.dataset.error = msg.name;
        } else if (name === 'failed') {
          throw new Error(msg.error || 'the code interpreter failed');
        } else if (name === 'end') {
          ended = true;
          cell.dataset.done = 'true';
          const ms = Number(msg.durationMs);
          status.textContent = ms < 1000 ? `${ms} ms` : fmtDuration(ms);
        }
      });
      if (!ended) throw new Error('the stream ended before the cell did');
      $('code-input').value = '';
    } catch (e) {
      status.textContent = ctrl.signal.aborted ? 'stopped: the kernel was interrupted' : e.message;
      cell.dataset.done = 'true';
      cell.dataset.error = cell.dataset.error || 'failed';
    } finally {
      if (state.code.run === ctrl) state.code.run = null;
      $('code-run').disabled = false;
      $('code-stop').disabled = true;
    }
  }

  async function restartKernel() {
    const sb = state.sandbox;
    const id = state.code.contexts[$('code-language').value];
    if (!sb || !id) return;
    $('code-status').textContent = 'restarting the kernel…';
    await api('POST', sbPath(sb.sandboxId, `/code/contexts/${encodeURIComponent(id)}/restart`));
    $('code-status').textContent = 'a new kernel: its variables are gone';
  }

  // ---- processes of the open sandbox -----------------------------------------

  async function loadProcesses() {
    const sb = state.sandbox;
    if (!sb) return;
    const data = await api('GET', sbPath(sb.sandboxId, '/processes'));
    if (!state.sandbox || state.sandbox.sandboxId !== sb.sandboxId) return;
    const rows = (data.processes || []).map((p) => el('tr', { dataset: { pid: String(p.pid) } },
      el('td', { text: String(p.pid) }),
      el('td', { class: 'mono', text: shellJoin(Array.isArray(p.command) ? p.command : [String(p.command)]) + (p.pty ? ' (terminal)' : ''), title: p.cwd ? 'in ' + p.cwd : '' }),
      el('td', { class: 'opt mono', text: p.tag || '' }),
      el('td', { class: 'opt', text: fmtShort(p.startedAt), title: fmtTime(p.startedAt) }),
      el('td', { class: 'actions' }, el('button', { type: 'button', class: 'danger kill', text: 'Kill', onclick: (e) => run(killProcess(e.currentTarget, p.pid)) }))));
    $('procs-body').replaceChildren(...rows);
    $('procs-table').hidden = rows.length === 0;
    $('procs-note').textContent = rows.length ? `${rows.length} running, as of ${new Date().toLocaleTimeString()}.` : 'No process runs in it.';
  }

  async function killProcess(button, pid) {
    const sb = state.sandbox;
    if (!sb) return;
    button.disabled = true;
    const signal = $('procs-signal').value;
    try {
      await api('DELETE', sbPath(sb.sandboxId, `/processes/${encodeURIComponent(pid)}?signal=${encodeURIComponent(signal)}`));
    } catch (e) {
      say('sb-error', e.message);
    }
    await loadProcesses();
  }

  // ---- runs --------------------------------------------------------------------

  function exitOf(r) {
    return r.output && typeof r.output === 'object' && typeof r.output.exitCode === 'number' ? r.output.exitCode : null;
  }

  function payloadOf(r) {
    return r.payload && typeof r.payload === 'object' ? r.payload : {};
  }

  // promptOf is the prompt of a prompt's run, or null: a prompt runs as
  // opencode run PROMPT (run -- PROMPT when it starts with a dash), unless
  // the payload names it itself.
  function promptOf(r) {
    const p = payloadOf(r);
    if (typeof p.prompt === 'string') return p.prompt;
    const a = Array.isArray(p.args) ? p.args : [];
    if (p.command !== 'opencode' || a[0] !== 'run') return null;
    if (a.length === 2 && typeof a[1] === 'string') return a[1];
    if (a.length === 3 && a[1] === '--' && typeof a[2] === 'string') return a[2];
    return null;
  }

  const TASKS = { 'run-sandbox-command': 'command', 'setup-sandbox': 'setup', 'coding-agent': 'agent' };

  function runKind(r) {
    if (/prompt/i.test(r.taskIdentifier || '') || (r.taskIdentifier === 'run-sandbox-command' && promptOf(r) !== null)) return 'prompt';
    return TASKS[r.taskIdentifier] || r.taskIdentifier || 'run';
  }

  // sandboxOf is the sandbox a run ran in: its sandboxId, or (older
  // servers) its payload's, its output's or its sandbox: tag.
  function sandboxOf(r) {
    const o = r.output && typeof r.output === 'object' ? r.output : {};
    for (const v of [r.sandboxId, payloadOf(r).sandboxId, o.sandboxId]) if (typeof v === 'string' && v) return v;
    for (const t of r.tags || []) if (typeof t === 'string' && t.startsWith('sandbox:')) return t.slice(8);
    return '';
  }

  const ENDED = new Set(['COMPLETED', 'FAILED', 'CRASHED', 'CANCELED', 'SYSTEM_FAILURE', 'INTERRUPTED', 'TIMED_OUT', 'EXPIRED']);

  // outcomeOf: active, success or failure. A command that exited non-zero
  // failed, though its run is COMPLETED (it ran to its end).
  function outcomeOf(r) {
    if (!r.isCompleted && !ENDED.has(r.status)) return 'active';
    if (r.isFailed || r.status !== 'COMPLETED') return 'failure';
    const code = exitOf(r);
    return code !== null && code !== 0 ? 'failure' : 'success';
  }

  // runStatusText is the status with the exit code of a command that
  // failed: "COMPLETED · exit 3".
  function runStatusText(r) {
    const code = exitOf(r);
    return code !== null && code !== 0 ? `${r.status} · exit ${code}` : r.status;
  }

  function runBadge(r) {
    const outcome = outcomeOf(r);
    const b = el('span', { class: 'badge ' + (outcome === 'failure' ? 'st-failed' : 'st-' + String(r.status).toLowerCase()), text: runStatusText(r) });
    b.dataset.outcome = outcome;
    if (outcome === 'failure' && r.status === 'COMPLETED') b.title = `The command ran to its end and exited with status ${exitOf(r)}`;
    return b;
  }

  function runCommandText(r) {
    const prompt = promptOf(r);
    if (prompt !== null) return prompt;
    const p = payloadOf(r);
    return p.command ? shellJoin([p.command, ...(Array.isArray(p.args) ? p.args : [])]) : '';
  }

  async function loadRuns(selected, refreshing) {
    const { data, resp } = await request('GET', '/api/tasks/runs?limit=50');
    const fresh = data.runs || [];
    // The newest page again; older pages loaded before are kept.
    const seen = new Set(fresh.map((r) => r.id));
    const older = refreshing ? state.runs.filter((r) => !seen.has(r.id)) : [];
    state.runs = fresh.concat(older);
    if (!refreshing || !older.length) state.runsCursor = resp.headers.get('X-Next-Cursor');
    // A run whose log is arriving has started, whatever an answer the
    // server gave a moment before says.
    if (state.runStream && $('run-status').dataset.status === 'EXECUTING') {
      for (const r of state.runs) if (r.id === state.openRun && r.status === 'QUEUED') r.status = 'EXECUTING';
    }
    renderRuns();
    // While its log is followed, the open run's status comes from the
    // list; its end comes from the stream, once the whole log is shown.
    const open = state.runs.find((r) => r.id === state.openRun);
    if (open && !open.isCompleted && state.runStream) showRunStatus(open);
    if (selected && !refreshing && selected !== state.openRun) openRun(selected);
    if (!selected) { stopRunStream(); $('run-detail').hidden = true; }
  }

  async function loadOlderRuns() {
    if (!state.runsCursor) return;
    const { data, resp } = await request('GET', '/api/tasks/runs?limit=50&cursor=' + encodeURIComponent(state.runsCursor));
    const seen = new Set(state.runs.map((r) => r.id));
    state.runs = state.runs.concat((data.runs || []).filter((r) => !seen.has(r.id)));
    state.runsCursor = resp.headers.get('X-Next-Cursor');
    renderRuns();
  }

  function renderRuns() {
    const status = $('runs-filter-status').value;
    const text = $('runs-filter-text').value.trim().toLowerCase();
    const shown = state.runs.filter((r) => (!status || outcomeOf(r) === status) &&
      (!text || [r.id, sandboxOf(r), runCommandText(r)].some((v) => String(v).toLowerCase().includes(text))));
    const rows = shown.map((r) => {
      const sandbox = sandboxOf(r);
      const kind = runKind(r);
      return el('tr', {
        class: 'clickable' + (r.id === state.openRun ? ' selected' : ''),
        dataset: { run: r.id, status: r.status, outcome: outcomeOf(r), kind },
        onclick: () => { location.hash = '#runs/' + encodeURIComponent(r.id); },
      },
      el('td', { class: 'mono' }, link('#runs/' + encodeURIComponent(r.id), r.id)),
      el('td', { class: 'kind', text: kind, title: r.taskIdentifier || '' }),
      el('td', { class: 'mono sandbox' }, sandbox ? link('#sandbox/' + encodeURIComponent(sandbox), sandbox) : '—'),
      el('td', null, runBadge(r)),
      el('td', { class: 'opt nowrap', text: fmtShort(r.createdAt), title: fmtTime(r.createdAt) }),
      el('td', { class: 'opt nowrap', text: fmtDuration(r.durationMs) }));
    });
    $('runs-body').replaceChildren(...rows);
    $('runs-empty').hidden = rows.length > 0;
    $('runs-empty').textContent = state.runs.length ? 'No run matches the filter.' : 'No runs yet.';
    $('runs-more').hidden = !state.runsCursor;
  }

  function stopRunStream() {
    if (state.runStream) state.runStream.abort();
    state.runStream = null;
    state.openRun = null;
  }

  function showRunStatus(r) {
    const p = $('run-status');
    const parts = [r.status];
    const code = exitOf(r);
    if (code !== null) parts.push(`exit ${code}`);
    if (r.durationMs) parts.push(fmtDuration(r.durationMs));
    if (r.error && r.error.message) parts.push(r.error.message);
    p.textContent = parts.join(' · ');
    p.dataset.status = r.status;
    p.dataset.outcome = outcomeOf(r);
    p.className = 'status ' + (outcomeOf(r) === 'failure' ? 'st-failed' : 'st-' + String(r.status).toLowerCase());
  }

  function showRunHeader(r) {
    const kind = runKind(r);
    $('run-kind').textContent = kind;
    const sandbox = sandboxOf(r);
    $('run-sandbox').replaceChildren(sandbox ? link('#sandbox/' + encodeURIComponent(sandbox), sandbox, 'mono') : '—');
    $('run-command-label').textContent = kind === 'prompt' ? 'Prompt' : 'Command';
    $('run-command').textContent = runCommandText(r) || '—';
  }

  async function openRun(id) {
    stopRunStream();
    const ctrl = new AbortController();
    state.runStream = ctrl;
    state.openRun = id;
    for (const tr of document.querySelectorAll('#runs-body tr')) tr.classList.toggle('selected', tr.dataset.run === id);
    const pre = $('run-log');
    pre.replaceChildren();
    $('run-detail').hidden = false;
    $('run-title').textContent = id;
    for (const f of ['run-kind', 'run-sandbox', 'run-command']) $(f).replaceChildren();
    $('run-status').textContent = 'following the log…';
    $('run-status').dataset.status = '';
    $('run-status').dataset.outcome = '';
    $('run-status').className = 'status';
    let first;
    try {
      first = (await api('GET', '/api/tasks/runs?runId=' + encodeURIComponent(id))).runs[0];
    } catch (e) {
      $('run-status').textContent = e.message;
      return;
    }
    if (state.runStream !== ctrl) return;
    showRunHeader(first);
    showRunStatus(first);
    $('run-status').dataset.status = first.isCompleted ? '' : first.status;
    let got = false;
    try {
      const resp = await fetch(`/api/tasks/runs/${encodeURIComponent(id)}/log`, {
        headers: { 'x-api-key': state.key, Accept: 'text/event-stream' },
        cache: 'no-store', credentials: 'omit', signal: ctrl.signal,
      });
      if (!resp.ok) throw new APIError(resp.status, `the log: HTTP ${resp.status}`);
      await readEvents(resp.body, (name, data) => {
        const msg = JSON.parse(data);
        if (name === 'log') {
          got = true;
          appendOut(pre, msg.data);
          // A run that logs has started (the list's refresh says more).
          if ($('run-status').dataset.status === 'QUEUED') {
            $('run-status').textContent = 'EXECUTING';
            $('run-status').dataset.status = 'EXECUTING';
            $('run-status').className = 'status st-executing';
            const listed = state.runs.find((x) => x.id === id);
            if (listed && listed.status === 'QUEUED') { listed.status = 'EXECUTING'; renderRuns(); }
            run(loadRuns(id, true));
          }
        }
        else if (name === 'error') appendOut(pre, `\n[${msg.error}]\n`);
      });
    } catch (e) {
      if (ctrl.signal.aborted) return;
      appendOut(pre, `\n[the log stream broke: ${e.message}]\n`);
    }
    if (state.runStream !== ctrl) return;
    // The stream ended with the run: show how it ended, and its output
    // when it had no log (a task's run, or a pruned log).
    const r = (await api('GET', '/api/tasks/runs?runId=' + encodeURIComponent(id))).runs[0];
    if (state.runStream !== ctrl) return;
    if (!got && r.output && typeof r.output === 'object') {
      if (r.output.stdout) appendOut(pre, r.output.stdout);
      if (r.output.stderr) appendOut(pre, r.output.stderr, 'stderr');
      if (!r.output.stdout && !r.output.stderr) appendOut(pre, JSON.stringify(r.output, null, 2));
    }
    showRunHeader(r);
    showRunStatus(r);
    run(loadRuns(id, true));
  }
  // ---- files -------------------------------------------------------------------

  async function loadFiles(path) {
    const data = await api('GET', '/api/sandboxes');
    $('repo-url').textContent = data.github_repo ? `Repository: ${data.github_repo} (main)` : 'The account has no repository yet: it gets one with its first run.';
    const tree = $('tree');
    if (!data.filetree) {
      tree.replaceChildren(el('p', { class: 'note', text: 'No files.' }));
    } else {
      tree.replaceChildren(buildTree(data.filetree));
      if (data.filetree_truncated) tree.append(el('p', { class: 'note', text: 'The tree was cut at the server\'s limit.' }));
    }
    if (path) await openFile(path);
    else { clearPreview(); $('preview').hidden = true; }
  }

  // buildTree renders the flat tree listing as nested lists; directories
  // fold (<details>).
  function buildTree(entries) {
    const root = { dirs: new Map(), files: [] };
    for (const e of entries) {
      const parts = e.path.split('/');
      let node = root;
      for (let i = 0; i < parts.length - 1; i++) {
        if (!node.dirs.has(parts[i])) node.dirs.set(parts[i], { dirs: new Map(), files: [] });
        node = node.dirs.get(parts[i]);
      }
      const name = parts[parts.length - 1];
      if (e.type === 'tree') {
        if (!node.dirs.has(name)) node.dirs.set(name, { dirs: new Map(), files: [] });
      } else {
        node.files.push({ name, path: e.path, size: e.size });
      }
    }
    const render = (node) => {
      const ul = el('ul');
      for (const name of [...node.dirs.keys()].sort()) {
        const d = el('details', null, el('summary', { text: name + '/' }), render(node.dirs.get(name)));
        ul.append(el('li', null, d));
      }
      for (const f of node.files.sort((a, b) => a.name.localeCompare(b.name))) {
        ul.append(el('li', null, el('button', {
          type: 'button', class: 'file', text: f.name, title: `${f.path} (${fmtBytes(f.size)})`,
          dataset: { path: f.path },
          onclick: () => { location.hash = '#files/' + encodeURIComponent(f.path); },
        })));
      }
      return ul;
    };
    return render(root);
  }

  const MIME = {
    png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', webp: 'image/webp',
    svg: 'image/svg+xml', ico: 'image/x-icon', bmp: 'image/bmp', avif: 'image/avif', pdf: 'application/pdf',
  };

  function clearPreview() {
    if (state.previewURL) URL.revokeObjectURL(state.previewURL);
    state.previewURL = null;
    $('preview-body').replaceChildren();
  }

  function base64Bytes(s) {
    const bin = atob(s);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function openFile(path) {
    state.openFile = path;
    for (const b of document.querySelectorAll('#tree .file')) {
      const on = b.dataset.path === path;
      b.classList.toggle('selected', on);
      if (on) for (let d = b.closest('details'); d; d = d.parentElement.closest('details')) d.open = true;
    }
    $('preview').hidden = false;
    $('preview-title').textContent = path;
    $('preview-info').textContent = 'loading…';
    clearPreview();
    let data;
    try {
      data = await api('GET', '/api/sandboxes/file?path=' + encodeURIComponent(path));
    } catch (e) {
      $('preview-info').textContent = e.message;
      return;
    }
    if (state.openFile !== path) return;
    const ext = path.includes('.') ? path.split('.').pop().toLowerCase() : '';
    const body = $('preview-body');
    if (data.encoding === 'base64') {
      const bytes = base64Bytes(data.content);
      const type = MIME[ext];
      const name = path.split('/').pop();
      $('preview-info').textContent = `${fmtBytes(bytes.length)}${type ? ', ' + type : ', binary'}`;
      state.previewURL = URL.createObjectURL(new Blob([bytes], { type: type || 'application/octet-stream' }));
      if (type && type.startsWith('image/')) {
        body.append(el('img', { id: 'preview-image', src: state.previewURL, alt: name }));
      } else if (type === 'application/pdf') {
        body.append(el('iframe', { id: 'preview-pdf', src: state.previewURL, title: name }));
      }
      body.append(el('p', null, el('a', { href: state.previewURL, download: name, text: 'Download ' + name })));
      return;
    }
    const text = data.content || '';
    const lines = text.split('\n').length;
    const lang = languageOf(path);
    $('preview-info').textContent = `${lines} lines, ${fmtBytes(new TextEncoder().encode(text).length)}${lang && text.length <= HIGHLIGHT_MAX_CHARS ? ', ' + lang : ''}`;
    body.append(renderCode(text, text.length <= HIGHLIGHT_MAX_CHARS ? lang : null));
  }


  // uploadFiles commits the chosen files to the account's repository
  // (POST /api/sandboxes/files, multipart), as `sandboxd sandbox upload`.
  async function uploadFiles(ev) {
    ev.preventDefault();
    const files = [...$('upload-files').files];
    const result = $('upload-result');
    result.className = 'note';
    if (!files.length) { result.textContent = 'Choose files first.'; return; }
    const form = new FormData();
    const dir = $('upload-path').value.trim();
    const message = $('upload-message').value.trim();
    if (dir) form.append('path', dir);
    if (message) form.append('message', message);
    for (const f of files) form.append('file', f, f.name);
    result.textContent = `uploading ${files.length} file${files.length === 1 ? '' : 's'}…`;
    await busy('upload', async () => {
      let data;
      try {
        data = await api('POST', '/api/sandboxes/files', form);
      } catch (e) {
        result.className = 'error';
        result.textContent = e.message;
        return;
      }
      const done = (data.uploaded || []).map((u) => u.path);
      const failed = data.errors || [];
      result.className = failed.length ? 'error' : 'note';
      result.textContent = (done.length ? 'Uploaded ' + done.join(', ') + '.' : '') + (failed.length ? ' Not uploaded: ' + failed.join('; ') : '');
      $('upload-files').value = '';
      if (state.view === 'files') await loadFiles(state.arg);
    });
  }
  // ---- syntax highlighting: a tiny tokenizer whose tokens become text
  // nodes in spans, so no file content is ever parsed as markup. ----------

  const KEYWORDS = {
    js: 'async await break case catch class const continue debugger default delete do else export extends false finally for from function if import in instanceof let new null of return static super switch this throw true try typeof undefined var void while with yield interface type enum implements',
    go: 'break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false iota',
    py: 'and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield self',
    sh: 'if then else elif fi for while until do done case esac in function return local export set unset echo exit',
    c: 'auto break case char const continue default do double else enum extern float for goto if int long register return short signed sizeof static struct switch typedef union unsigned void volatile while fn let mut pub impl trait use mod match loop self Self true false null public private protected class new',
    json: 'true false null',
  };
  const LANGS = {
    js: 'js', mjs: 'js', cjs: 'js', ts: 'js', tsx: 'js', jsx: 'js',
    go: 'go', py: 'py', sh: 'sh', bash: 'sh', zsh: 'sh', yml: 'sh', yaml: 'sh', toml: 'sh', dockerfile: 'sh', makefile: 'sh',
    c: 'c', h: 'c', cc: 'c', cpp: 'c', hpp: 'c', rs: 'c', java: 'c', kt: 'c', css: 'c', json: 'json', md: 'md', markdown: 'md',
  };
  const LANG_NAMES = { js: 'JavaScript', go: 'Go', py: 'Python', sh: 'shell', c: 'C-like', json: 'JSON', md: 'Markdown' };

  function languageOf(path) {
    const base = path.split('/').pop().toLowerCase();
    const ext = base.includes('.') ? base.split('.').pop() : base;
    const lang = LANGS[ext];
    return lang ? LANG_NAMES[lang] : null;
  }

  // The patterns of each family, tried in order at each position.
  function patternsOf(lang) {
    const num = /\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b/;
    switch (lang) {
      case 'JavaScript': case 'Go': case 'C-like':
        return [['com', /\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)/], ['str', /"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`(?:[^`\\]|\\[\s\S])*`?/], ['num', num]];
      case 'Python':
        return [['com', /#[^\n]*/], ['str', /"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?/], ['num', num]];
      case 'shell':
        return [['com', /(?:^|(?<=\s))#[^\n]*/], ['str', /"(?:[^"\\]|\\[\s\S])*"?|'[^']*'?/], ['var', /\$\{[^}\n]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9@#?$!*-]/], ['num', num]];
      case 'JSON':
        return [['key', /"(?:[^"\\\n]|\\.)*"(?=\s*:)/], ['str', /"(?:[^"\\\n]|\\.)*"?/], ['num', /-?\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b/]];
      case 'Markdown':
        return [['kw', /^#{1,6} [^\n]*/m], ['str', /`[^`\n]*`/], ['com', /^> [^\n]*/m]];
    }
    return [];
  }

  // tokenize splits text into [class, text] pairs ('' for plain text).
  function tokenize(text, lang) {
    const pats = patternsOf(lang);
    if (!pats.length) return [['', text]];
    const big = new RegExp(pats.map(([, re]) => `(${re.source})`).join('|'), 'gm');
    const words = new Set((KEYWORDS[{ JavaScript: 'js', Go: 'go', Python: 'py', shell: 'sh', 'C-like': 'c', JSON: 'json' }[lang]] || '').split(' ').filter(Boolean));
    const out = [];
    const plain = (s) => {
      if (!s) return;
      if (!words.size) { out.push(['', s]); return; }
      let last = 0;
      for (const m of s.matchAll(/[A-Za-z_][A-Za-z0-9_]*/g)) {
        if (!words.has(m[0])) continue;
        if (m.index > last) out.push(['', s.slice(last, m.index)]);
        out.push(['kw', m[0]]);
        last = m.index + m[0].length;
      }
      if (last < s.length) out.push(['', s.slice(last)]);
    };
    let last = 0;
    for (const m of text.matchAll(big)) {
      if (!m[0]) continue;
      plain(text.slice(last, m.index));
      const group = m.slice(1).findIndex((g) => g !== undefined);
      out.push([pats[group][0], m[0]]);
      last = m.index + m[0].length;
    }
    plain(text.slice(last));
    return out;
  }

  // renderCode shows text with line numbers, its tokens in spans.
  function renderCode(text, lang) {
    const code = el('code');
    const pre = el('pre', { id: 'preview-text', class: 'code' }, code);
    if (lang) pre.dataset.lang = lang;
    let n = 0;
    let line = null;
    const newLine = () => {
      if (line) code.append(line, document.createTextNode('\n'));
      n++;
      line = el('span', { class: 'line' }, el('span', { class: 'ln', text: String(n) }));
    };
    newLine();
    for (const [cls, s] of (lang ? tokenize(text, lang) : [['', text]])) {
      const parts = s.split('\n');
      parts.forEach((part, i) => {
        if (i > 0) newLine();
        if (!part) return;
        line.append(cls ? el('span', { class: 'tok-' + cls, text: part }) : document.createTextNode(part));
      });
    }
    code.append(line);
    return pre;
  }

  // ---- snapshots -----------------------------------------------------------------

  async function loadSnapshots() {
    const data = await api('GET', '/api/snapshots');
    const short = (id) => (id && id.length > 14 ? id.slice(0, 13) + '…' : id || '—');
    $('snapshots-current').textContent = data.snapshot_id
      ? `The account's next sandbox starts from ${data.snapshot_id} (until ${fmtTime(data.expires_at)}).`
      : 'The account has no snapshot to start from: its next sandbox starts fresh from the image.';
    const rows = (data.snapshots || []).map((s) => el('tr', { dataset: { snapshot: s.id } },
      el('td', { class: 'mono', text: s.id, title: s.id }),
      el('td', { text: fmtTime(s.created_at) }),
      el('td', { class: 'opt mono', text: s.sandbox_id || '—' }),
      el('td', { class: 'opt mono', text: short(s.parent_id), title: s.parent_id || 'the base image' }),
      el('td', { class: 'opt', text: String(s.depth) }),
      el('td', { text: fmtBytes(s.size) }),
      el('td', null, s.current ? el('span', { class: 'badge st-running', text: 'current' }) : null)));
    $('snapshots-body').replaceChildren(...rows);
    if (!rows.length) $('snapshots-body').append(el('tr', null, el('td', { colSpan: 7, class: 'note', text: 'No snapshots yet: one is taken after each run.' })));
  }


  // ---- templates: build, follow the build's log, start a sandbox, delete --

  // tplRef is how a template is named: name:tag.
  const tplRef = (t) => `${t.name}:${t.tag}`;
  const tplPath = (id) => `/api/templates/${encodeURIComponent(id)}`;

  async function loadTemplates() {
    const data = await api('GET', '/api/templates');
    const list = data.templates || [];
    const rows = list.map((t) => {
      const open = () => { location.hash = '#template/' + encodeURIComponent(t.id); };
      const statusCell = el('td', null, statusBadge(t.status));
      if (t.status === 'failed' && t.failureReason) statusCell.append(el('span', { class: 'reason', text: t.failureReason }));
      return el('tr', { class: 'clickable', dataset: { template: t.id, ref: tplRef(t), status: t.status }, onclick: open },
        el('td', { class: 'mono' }, link('#template/' + encodeURIComponent(t.id), tplRef(t), 'template-link'), t.public ? ' (public)' : null),
        statusCell,
        el('td', { class: 'opt mono', text: t.source || '—' }),
        el('td', { class: 'opt', text: fmtTime(t.createdAt) }));
    });
    $('templates-body').replaceChildren(...rows);
    $('templates-empty').hidden = rows.length > 0;
  }

  async function buildTemplate(ev) {
    ev.preventDefault();
    say('tpl-build-error', '');
    const body = { name: $('tpl-name').value.trim() };
    const fields = { image: 'tpl-image', dockerfile: 'tpl-dockerfile', startCmd: 'tpl-start', readyCmd: 'tpl-ready' };
    for (const [k, id] of Object.entries(fields)) {
      // A Dockerfile keeps its lines as written; the one-line fields are trimmed.
      const v = k === 'dockerfile' ? $(id).value : $(id).value.trim();
      if (v.trim()) body[k] = v;
    }
    await busy('tpl-build', async () => {
      let data;
      try {
        data = await api('POST', '/api/templates', body);
      } catch (e) {
        say('tpl-build-error', e.message);
        return;
      }
      for (const id of Object.values(fields).concat('tpl-name')) $(id).value = '';
      location.hash = '#template/' + encodeURIComponent(data.template.id);
    });
  }

  const TEMPLATE_LABELS = {
    id: 'Id', status: 'Status', source: 'Source', digest: 'Digest', public: 'Public',
    createdAt: 'Created', updatedAt: 'Updated',
  };

  async function loadTemplate(id) {
    clearTimeout(state.templateTimer);
    if (!state.template || state.template.id !== id) {
      state.template = null;
      $('tpl-title').textContent = id;
      $('tpl-badge').replaceChildren();
      $('tpl-fields').replaceChildren();
      $('tpl-log').replaceChildren();
      $('tpl-log-note').textContent = '';
      $('tpl-failure').hidden = true;
      $('tpl-confirm').hidden = true;
      for (const b of $('tpl-buttons').querySelectorAll('button')) b.disabled = true;
      say('tpl-error', '');
    }
    let data;
    try {
      data = await api('GET', tplPath(id));
    } catch (e) {
      if (state.view !== 'template' || state.arg !== id) return;
      if (e.status === 404) {
        state.template = null;
        say('tpl-error', 'No such template: it is not this account\'s, or it was deleted.');
        return;
      }
      // A look that failed is not the build's end: look again later.
      state.templateTimer = setTimeout(() => run(loadTemplate(id)), REFRESH_MS);
      throw e;
    }
    if (state.view !== 'template' || state.arg !== id) return;
    renderTemplate(data.template);
    // While it builds, look again soon; once it ended, it no longer changes.
    if (data.template.status === 'building') state.templateTimer = setTimeout(() => run(loadTemplate(id)), BUILD_POLL_MS);
  }

  function renderTemplate(t) {
    state.template = t;
    $('tpl-title').textContent = tplRef(t);
    $('tpl-badge').replaceChildren(statusBadge(t.status));
    $('view-template').dataset.status = t.status;
    const failed = t.status === 'failed';
    $('tpl-failure').hidden = !failed;
    $('tpl-failure').textContent = failed ? 'The build failed: ' + (t.failureReason || 'the server gives no reason.') : '';
    const keys = Object.keys(TEMPLATE_LABELS).filter((k) => k in t);
    const value = (k) => {
      const v = t[k];
      if (k === 'status') return statusBadge(v);
      if (k === 'createdAt' || k === 'updatedAt') return fmtTime(v);
      if (k === 'public') return v ? 'yes: the operator\'s, offered to every account' : 'no: this account\'s';
      return v === null || v === undefined || v === '' ? '—' : String(v);
    };
    const rows = keys.map((k) => el('div', { dataset: { field: k } }, el('dt', { text: TEMPLATE_LABELS[k] }), el('dd', null, value(k))));
    // What a sandbox takes of the image's config.
    const c = t.config;
    if (c) {
      const cfg = [['Environment', (c.env || []).join('\n')], ['Working directory', c.workingDir], ['User', c.user],
        ['Command', c.cmd && c.cmd.length ? shellJoin(c.cmd) : ''], ['Entrypoint', c.entrypoint && c.entrypoint.length ? shellJoin(c.entrypoint) : '']];
      for (const [label, v] of cfg) {
        rows.push(el('div', { dataset: { field: label } }, el('dt', { text: label }), el('dd', { class: 'mono lines', text: v || '—' })));
      }
    }
    $('tpl-fields').replaceChildren(...rows);
    // The log: kept scrolled to its end while the reader is there.
    const pre = $('tpl-log');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const log = typeof t.log === 'string' ? t.log : '';
    if (pre.textContent !== log) {
      pre.textContent = log;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
    $('tpl-log-note').textContent = t.status === 'building'
      ? 'Building: the log grows as the build goes (its last 64 KiB are kept).'
      : 'Its last 64 KiB.';
    $('tpl-sandbox').disabled = t.status !== 'ready';
    $('tpl-delete').disabled = !!t.public || !$('tpl-confirm').hidden;
    $('tpl-delete').title = t.public ? 'Public templates are the operator\'s' : '';
  }

  function askDeleteTemplate() {
    const t = state.template;
    if (!t) return;
    say('tpl-error', '');
    $('tpl-confirm-text').textContent = `Delete ${tplRef(t)}? Sandboxes can no longer start from it.`;
    $('tpl-confirm').hidden = false;
    $('tpl-delete').disabled = true;
  }

  function keepTemplate() {
    $('tpl-confirm').hidden = true;
    if (state.template) renderTemplate(state.template);
  }

  async function deleteTemplate() {
    const t = state.template;
    if (!t) return;
    await busy('tpl-delete-yes', async () => {
      try {
        await api('DELETE', tplPath(t.id));
      } catch (e) {
        $('tpl-confirm').hidden = true;
        say('tpl-error', e.message);
        renderTemplate(t);
        return;
      }
      $('tpl-confirm').hidden = true;
      state.template = null;
      location.hash = '#templates';
    });
  }

  // newSandboxFrom opens the create form with the template chosen.
  function newSandboxFrom() {
    const t = state.template;
    if (!t || t.status !== 'ready') return;
    state.createTemplate = tplRef(t);
    location.hash = '#sandboxes';
  }

  // loadTemplateChoices offers the ready templates in the create form
  // (none, or a server without templates: the choice is hidden). The
  // options are made again only when the list changed, so a refresh never
  // takes the choice back.
  async function loadTemplateChoices() {
    let list = [];
    try {
      list = ((await api('GET', '/api/templates')).templates || []).filter((t) => t.status === 'ready');
    } catch (e) {
      if (e.status === 401) throw e;
      list = [];
    }
    // The account's own before a public one of the same name, as a create resolves it.
    const refs = [];
    for (const t of list.filter((x) => !x.public).concat(list.filter((x) => x.public))) {
      if (!refs.some((r) => r.ref === tplRef(t))) refs.push({ ref: tplRef(t), public: !!t.public });
    }
    const sig = JSON.stringify(refs);
    const select = $('new-template');
    if (sig !== state.templateChoices) {
      state.templateChoices = sig;
      const keep = select.value;
      select.replaceChildren(el('option', { value: '', text: 'the server\'s image' }),
        ...refs.map((r) => el('option', { value: r.ref, text: r.ref + (r.public ? ' (public)' : '') })));
      if (refs.some((r) => r.ref === keep)) select.value = keep;
    }
    $('new-template-label').hidden = refs.length === 0;
    if (state.createTemplate && refs.some((r) => r.ref === state.createTemplate)) {
      select.value = state.createTemplate;
      state.createTemplate = '';
      $('new-command').focus();
    }
  }

  // ---- volumes: the account's disks that outlive its sandboxes --------------

  const volPath = (name) => `/api/volumes/${encodeURIComponent(name)}`;

  // fmtMiB says a size in MiB: whole GiB as GiB.
  function fmtMiB(n) {
    if (typeof n !== 'number') return '—';
    return n >= 1024 && n % 1024 === 0 ? `${n / 1024} GiB` : `${n} MiB`;
  }

  // attachmentsOf lists the sandboxes a volume is mounted in, each a link.
  function attachmentsOf(v) {
    const list = Array.isArray(v.attachments) ? v.attachments : [];
    if (!list.length) return '—';
    return el('ul', { class: 'inline-list' }, ...list.map((a) => el('li', { dataset: { sandbox: a.sandbox_id } },
      link('#sandbox/' + encodeURIComponent(a.sandbox_id), a.sandbox_id, 'mono'),
      ` at ${a.path}${a.read_only ? ' (read-only)' : ''}`)));
  }

  async function loadVolumes(arg, refreshing) {
    if (!refreshing) {
      say('vol-error', '');
      state.volumeDelete = null;
      $('vol-confirm').hidden = true;
    }
    const data = await api('GET', '/api/volumes');
    if (state.view !== 'volumes') return;
    const list = data.volumes || [];
    const names = new Map(list.map((v) => [v.id, v.name]));
    const rows = list.map((v) => {
      const attached = Array.isArray(v.attachments) && v.attachments.length > 0;
      const name = el('td', { class: 'mono', title: v.id }, v.name);
      if (v.forked_from) name.append(el('span', { class: 'note', text: ` (a fork of ${names.get(v.forked_from) || v.forked_from})` }));
      if (v.microvm_written) {
        name.append(' ', el('span', { class: 'badge', text: 'microVM', title: 'A microVM has written it: only microVM sandboxes may mount it' }));
      }
      const mount = el('button', { type: 'button', text: 'New sandbox', title: 'The new sandbox form, with this volume chosen', dataset: { action: 'mount' }, onclick: () => newSandboxWith(v) });
      const del = el('button', { type: 'button', class: 'danger', text: 'Delete', dataset: { action: 'delete' }, onclick: () => askDeleteVolume(v) });
      return el('tr', { dataset: { volume: v.name, id: v.id, attached: attached ? 'yes' : 'no' } },
        name,
        el('td', { class: 'nowrap', text: fmtMiB(v.size_mb) }),
        el('td', null, attachmentsOf(v)),
        el('td', { class: 'opt', text: fmtTime(v.created_at) }),
        el('td', { class: 'actions' }, mount, ' ', del));
    });
    $('volumes-body').replaceChildren(...rows);
    $('volumes-empty').hidden = rows.length > 0;
  }

  async function createVolume(ev) {
    ev.preventDefault();
    say('vol-create-error', '');
    const body = { name: $('vol-name').value.trim() };
    const size = $('vol-size').value.trim();
    if (size !== '') {
      const mb = Number(size);
      if (!Number.isInteger(mb) || mb <= 0) {
        say('vol-create-error', 'The size must be a whole number of MiB.');
        return;
      }
      body.size_mb = mb;
    }
    await busy('vol-create', async () => {
      try {
        await api('POST', '/api/volumes', body);
      } catch (e) {
        say('vol-create-error', e.message);
        return;
      }
      $('vol-name').value = '';
      $('vol-size').value = '';
      await loadVolumes('', true);
    });
  }

  function askDeleteVolume(v) {
    say('vol-error', '');
    delete $('vol-error').dataset.status;
    state.volumeDelete = v.name;
    const attached = Array.isArray(v.attachments) && v.attachments.length > 0;
    $('vol-confirm-text').textContent = `Delete ${v.name} and its data? It cannot be undone.` +
      (attached ? ' A sandbox has it now: the server refuses until it stops.' : '');
    $('vol-confirm').hidden = false;
    $('vol-delete-yes').focus();
  }

  function keepVolume() {
    state.volumeDelete = null;
    $('vol-confirm').hidden = true;
  }

  // deleteVolume deletes the volume the confirmation names; the server's
  // refusal (409 while a sandbox has it) is shown as it says it.
  async function deleteVolume() {
    const name = state.volumeDelete;
    if (!name) return;
    await busy('vol-delete-yes', async () => {
      try {
        await api('DELETE', volPath(name));
      } catch (e) {
        say('vol-error', e.status === 409 ? `${name} was not deleted: ${e.message}` : e.message);
        $('vol-error').dataset.status = String(e.status || '');
      }
      keepVolume();
      await loadVolumes('', true);
    });
  }

  // newSandboxWith opens the create form with the volume chosen.
  function newSandboxWith(v) {
    state.createVolume = v.name;
    location.hash = '#sandboxes';
  }

  // loadVolumeChoices offers the account's volumes in the create form
  // (none, or a server without volumes: the choice is hidden). As the
  // templates, the options are made again only when the list changed.
  async function loadVolumeChoices() {
    let names = [];
    try {
      names = ((await api('GET', '/api/volumes')).volumes || []).map((v) => v.name);
    } catch (e) {
      if (e.status === 401) throw e;
      names = [];
    }
    const sig = JSON.stringify(names);
    const select = $('new-volume');
    if (sig !== state.volumeChoices) {
      state.volumeChoices = sig;
      const keep = select.value;
      select.replaceChildren(el('option', { value: '', text: 'none' }), ...names.map((n) => el('option', { value: n, text: n })));
      select.value = names.includes(keep) ? keep : '';
    }
    $('new-volume-row').hidden = names.length === 0;
    if (state.createVolume && names.includes(state.createVolume)) {
      select.value = state.createVolume;
      state.createVolume = '';
      $('new-volume-path').disabled = false;
      $('new-volume-path').focus();
    }
    volumeChoiceChanged();
  }

  // volumeChoiceChanged enables the mount's path and mode once a volume is
  // chosen.
  function volumeChoiceChanged() {
    const on = !!$('new-volume').value;
    $('new-volume-path').disabled = !on;
    $('new-volume-ro').disabled = !on;
  }

  // ---- terminal ------------------------------------------------------------------

  async function loadTerminal(id) {
    const data = await api('GET', '/api/sandboxes');
    const select = $('term-sandbox');
    const running = (data.sandboxes || []).filter((sb) => sb.sandboxStatus === 'running');
    select.replaceChildren(...running.map((sb) => el('option', { value: sb.sandboxId, text: sb.sandboxId })));
    if (!running.length) select.append(el('option', { value: '', text: 'no running sandbox' }));
    if (id && running.some((sb) => sb.sandboxId === id)) select.value = id;
    $('term-connect').disabled = !running.length || !!state.ws;
  }

  function termSize() {
    const pre = $('term');
    const probe = el('span', { text: 'MMMMMMMMMM' });
    pre.append(probe);
    const r = probe.getBoundingClientRect();
    probe.remove();
    const cw = r.width / 10 || 8;
    const lh = r.height || 16;
    const clamp = (v) => Math.max(1, Math.min(1000, Math.floor(v)));
    return { rows: clamp((pre.clientHeight - 8) / lh), cols: clamp((pre.clientWidth - 8) / cw) };
  }

  // termShow draws the terminal: its text, then the cursor where the next
  // character goes (while connected).
  function termShow() {
    const pre = $('term');
    state.termNode.data = state.termText;
    if (!state.termCursor) state.termCursor = el('span', { class: 'cursor', ariaHidden: 'true' });
    if (pre.firstChild !== state.termNode || pre.lastChild !== state.termCursor || pre.childNodes.length !== 2) {
      pre.replaceChildren(state.termNode, state.termCursor);
    }
    state.termCursor.hidden = !state.ws;
    pre.scrollTop = pre.scrollHeight;
  }

  // termWrite adds output: escape sequences dropped, a carriage return
  // starts its line again, a backspace takes back a character.
  function termWrite(s) {
    let t = state.termText;
    for (const chunk of stripEscapes(s).split(/(\r\n|\r|\x08|\x07)/)) {
      if (chunk === '\r\n') t += '\n';
      else if (chunk === '\r') t = t.slice(0, t.lastIndexOf('\n') + 1);
      else if (chunk === '\x08') { if (t && !t.endsWith('\n')) t = t.slice(0, -1); }
      else if (chunk !== '\x07') t += chunk;
    }
    if (t.length > TERM_KEEP_CHARS) t = t.slice(t.length - TERM_KEEP_CHARS);
    state.termText = t;
    termShow();
  }

  function connectTerminal(ev) {
    ev.preventDefault();
    const id = $('term-sandbox').value;
    if (!id || state.ws) return;
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    // The key goes as the API's subprotocol: a browser cannot set headers
    // on a websocket, and a URL would leak it into logs.
    const ws = new WebSocket(`${proto}//${location.host}/api/sandboxes/${encodeURIComponent(id)}/exec`, ['sandboxd.key.' + state.key]);
    ws.binaryType = 'arraybuffer';
    state.ws = ws;
    const decoder = new TextDecoder();
    state.termText = '';
    termShow();
    $('term-state').textContent = 'connecting…';
    $('term-connect').disabled = true;
    $('term-disconnect').disabled = false;
    ws.onopen = () => {
      $('term-state').textContent = 'connected to ' + id;
      ws.send(JSON.stringify({ command: 'sh', env: { TERM: 'dumb' }, pty: termSize() }));
      $('term').focus();
    };
    ws.onmessage = (m) => {
      if (typeof m.data === 'string') {
        let msg = {};
        try { msg = JSON.parse(m.data); } catch (e) { return; }
        if (msg.type === 'exit') termWrite(`\n[exited with status ${msg.exitCode}]\n`);
        else if (msg.type === 'error') termWrite(`\n[error: ${msg.error}]\n`);
        return;
      }
      termWrite(decoder.decode(new Uint8Array(m.data).subarray(1), { stream: true }));
    };
    ws.onclose = (e) => {
      if (state.ws !== ws) return;
      state.ws = null;
      termShow();
      $('term-state').textContent = e.code === 1000 ? 'disconnected' : `disconnected (${e.code}${e.reason ? ': ' + e.reason : ''})`;
      $('term-disconnect').disabled = true;
      if (state.key) run(loadTerminal());
    };
  }

  function disconnectTerminal() {
    const ws = state.ws;
    state.ws = null;
    if (ws) ws.close(1000);
    termShow();
    $('term-disconnect').disabled = true;
    $('term-state').textContent = '';
    if (state.view === 'terminal' && state.key) run(loadTerminal());
  }

  function termSend(s) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(new TextEncoder().encode(s));
  }

  const KEYS = {
    Enter: '\r', Backspace: '\x7f', Tab: '\t', Escape: '\x1b', ArrowUp: '\x1b[A', ArrowDown: '\x1b[B',
    ArrowRight: '\x1b[C', ArrowLeft: '\x1b[D', Home: '\x1b[H', End: '\x1b[F', Delete: '\x1b[3~',
    PageUp: '\x1b[5~', PageDown: '\x1b[6~',
  };

  function termKey(e) {
    if (!state.ws || e.metaKey || e.isComposing) return;
    let s = null;
    if (e.ctrlKey && !e.altKey && e.key.length === 1) {
      const c = e.key.toUpperCase().charCodeAt(0);
      if (c >= 64 && c < 96) s = String.fromCharCode(c - 64);
    } else if (KEYS[e.key]) {
      s = KEYS[e.key];
    } else if (e.key.length === 1) {
      s = (e.altKey ? '\x1b' : '') + e.key;
    }
    if (s !== null) { e.preventDefault(); termSend(s); }
  }

  // ---- start ------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    $('signin-form').addEventListener('submit', signIn);
    $('signout').addEventListener('click', () => signOut());
    $('create-form').addEventListener('submit', (e) => run(createSandbox(e)));
    $('new-kind').addEventListener('change', createKindChanged);
    $('new-network').addEventListener('change', () => { $('new-allow').hidden = $('new-network').value !== 'allow'; });
    createKindChanged();
    $('sb-filter-status').addEventListener('change', renderSandboxes);
    $('sb-filter-text').addEventListener('input', renderSandboxes);
    $('sb-all').addEventListener('change', () => run(loadSandboxes()));
    $('sb-stop').addEventListener('click', sandboxAction('stop'));
    $('sb-pause').addEventListener('click', sandboxAction('pause'));
    $('sb-pause-files').addEventListener('click', () => act('sb-pause-files', (sb) => api('POST', sbPath(sb.sandboxId, '/pause'), { memory: false })));
    $('sb-resume').addEventListener('click', sandboxAction('resume'));
    $('sb-terminal').addEventListener('click', () => { if (state.sandbox) location.hash = '#terminal/' + encodeURIComponent(state.sandbox.sandboxId); });
    $('sb-run').addEventListener('click', () => { if (state.sandbox && state.sandbox.runId) location.hash = '#runs/' + encodeURIComponent(state.sandbox.runId); });
    $('extend-form').addEventListener('submit', extendSandbox);
    $('fork-form').addEventListener('submit', forkSandbox);
    $('snapshot-form').addEventListener('submit', snapshotSandbox);
    $('network-form').addEventListener('submit', setNetwork);
    $('sb-network-kind').addEventListener('change', networkKindChanged);
    $('exec-form').addEventListener('submit', (e) => run(execCommand(e)));
    $('code-form').addEventListener('submit', (e) => run(runCell(e)));
    $('code-stop').addEventListener('click', () => { if (state.code.run) state.code.run.abort(); });
    $('code-restart').addEventListener('click', () => run(restartKernel()));
    $('code-language').addEventListener('change', () => { $('code-restart').disabled = !state.code.contexts[$('code-language').value]; });
    $('exec-stop').addEventListener('click', stopExec);
    $('procs-refresh').addEventListener('click', () => run(loadProcesses().catch((e) => say('sb-error', e.message))));
    $('runs-filter-status').addEventListener('change', renderRuns);
    $('runs-filter-text').addEventListener('input', renderRuns);
    $('runs-more').addEventListener('click', () => run(loadOlderRuns()));
    $('upload-form').addEventListener('submit', (e) => run(uploadFiles(e)));
    $('tpl-form').addEventListener('submit', (e) => run(buildTemplate(e)));
    $('tpl-sandbox').addEventListener('click', newSandboxFrom);
    $('tpl-delete').addEventListener('click', askDeleteTemplate);
    $('tpl-delete-no').addEventListener('click', keepTemplate);
    $('tpl-delete-yes').addEventListener('click', () => run(deleteTemplate()));
    $('vol-form').addEventListener('submit', (e) => run(createVolume(e)));
    $('vol-delete-yes').addEventListener('click', () => run(deleteVolume()));
    $('vol-delete-no').addEventListener('click', keepVolume);
    $('new-volume').addEventListener('change', volumeChoiceChanged);
    $('term-form').addEventListener('submit', connectTerminal);
    $('term-disconnect').addEventListener('click', disconnectTerminal);
    $('term').addEventListener('keydown', termKey);
    $('term').addEventListener('paste', (e) => { e.preventDefault(); termSend(e.clipboardData.getData('text')); });
    let resizeTimer = null;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify({ type: 'resize', ...termSize() }));
      }, 200);
    });
    window.addEventListener('hashchange', route);
    setInterval(tickDeadlines, 1000);
    setInterval(() => { if (!document.hidden) run(checkHealth()); }, HEALTH_MS);
    termShow();
    route();
  });
})();
