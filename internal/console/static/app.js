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
'use strict';

(() => {
  const KEY_STORAGE = 'sandboxd.key';
  const REFRESH_MS = 5000;
  const LOG_KEEP_CHARS = 2 << 20; // a run's log in the page: its last 2 MiB of text
  const TERM_KEEP_CHARS = 512 << 10;
  const HIGHLIGHT_MAX_CHARS = 512 << 10; // larger files are shown plain

  const $ = (id) => document.getElementById(id);

  const state = {
    key: sessionStorage.getItem(KEY_STORAGE),
    view: null,
    refreshTimer: null,
    runStream: null, // AbortController of the followed run log
    openRun: null,
    openFile: null,
    previewURL: null, // blob URL of the file preview, revoked on change
    ws: null,
    termText: '',
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

  function flash(msg) {
    const f = $('flash');
    f.textContent = msg || '';
    f.hidden = !msg;
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

  function statusBadge(status) {
    return el('span', { class: 'badge st-' + String(status).toLowerCase(), text: status });
  }

  // ---- the API -------------------------------------------------------------

  class APIError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const headers = { 'x-api-key': state.key };
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
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
    return data;
  }

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
    disconnectTerminal();
    clearPreview();
    for (const id of ['sandboxes-body', 'runs-body', 'tree', 'preview-body', 'snapshots-body', 'run-log']) $(id).replaceChildren();
    $('run-detail').hidden = true;
    $('preview').hidden = true;
    state.termText = '';
    $('term').textContent = '';
    flash('');
    history.replaceState(null, '', location.pathname);
    route();
    if (message) $('signin-error').textContent = message;
  }

  // ---- routing: #view or #view/argument ------------------------------------

  const views = {
    sandboxes: { load: loadSandboxes, refresh: true },
    runs: { load: (arg, refreshing) => loadRuns(arg, refreshing), refresh: true },
    files: { load: (arg) => loadFiles(arg) },
    snapshots: { load: loadSnapshots, refresh: true },
    terminal: { load: (arg) => loadTerminal(arg) },
  };

  function route() {
    clearInterval(state.refreshTimer);
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
    for (const s of document.querySelectorAll('main > .view')) s.hidden = s.id !== 'view-' + name;
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === name);
    state.view = name;
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

  // ---- sandboxes -------------------------------------------------------------

  async function loadSandboxes() {
    const data = await api('GET', '/api/sandboxes');
    const now = Date.now();
    const rows = (data.sandboxes || []).map((sb) => {
      const live = sb.sandboxStatus === 'running';
      const remaining = el('span', { class: 'remaining' });
      if (live) remaining.dataset.deadline = String(now + sb.timeout);
      else remaining.textContent = sb.sandboxStatus === 'paused' ? `${fmtDuration(sb.timeout)} (paused)` : '—';
      const actions = el('td', { class: 'actions' });
      if (live || sb.sandboxStatus === 'paused') {
        actions.append(
          el('button', { type: 'button', text: '+10 min', title: 'Extend its lifetime by 10 minutes', onclick: () => run(extend(sb)) }),
          el('button', { type: 'button', text: 'Stop', class: 'danger', onclick: () => run(stop(sb)) }));
      }
      if (live) {
        actions.append(el('button', { type: 'button', text: 'Terminal', onclick: () => { location.hash = '#terminal/' + encodeURIComponent(sb.sandboxId); } }));
      }
      if (sb.runId) {
        actions.append(el('button', { type: 'button', text: 'Run', title: 'The run it was created with', onclick: () => { location.hash = '#runs/' + encodeURIComponent(sb.runId); } }));
      }
      return el('tr', { dataset: { sandbox: sb.sandboxId, status: sb.sandboxStatus } },
        el('td', { class: 'mono', text: sb.sandboxId }),
        el('td', null, statusBadge(sb.sandboxStatus)),
        el('td', null, remaining),
        el('td', { text: fmtTime(sb.createdAt) }),
        el('td', { text: sb.runtime || '' }),
        actions);
    });
    $('sandboxes-body').replaceChildren(...rows);
    $('sandboxes-empty').hidden = rows.length > 0;
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
    if (expired && state.view === 'sandboxes' && !state.reloadPending) {
      state.reloadPending = true;
      setTimeout(() => { state.reloadPending = false; run(loadSandboxes()); }, 1500);
    }
  }

  async function createSandbox(ev) {
    ev.preventDefault();
    const kind = $('new-kind').value;
    const text = $('new-command').value.trim();
    const minutes = Number($('new-timeout').value) || 10;
    const body = { timeout: Math.round(minutes * 60000) };
    if (kind === 'command' && text) { body.command = 'sh'; body.args = ['-c', text]; }
    if (kind === 'prompt' && text) body.prompt = text;
    $('create').disabled = true;
    try {
      const data = await api('POST', '/api/sandboxes', body);
      const sb = (data.sandboxes || [])[0];
      $('new-command').value = '';
      if (sb && sb.runId) location.hash = '#runs/' + encodeURIComponent(sb.runId);
      else await loadSandboxes();
    } finally {
      $('create').disabled = false;
    }
  }

  async function extend(sb) {
    const row = document.querySelector(`tr[data-sandbox="${CSS.escape(sb.sandboxId)}"] [data-deadline]`);
    const left = row ? Math.max(0, Number(row.dataset.deadline) - Date.now()) : sb.timeout;
    await api('POST', `/api/sandboxes/${encodeURIComponent(sb.sandboxId)}/timeout`, { timeout: Math.round(left + 10 * 60000) });
    await loadSandboxes();
  }

  async function stop(sb) {
    await api('POST', `/api/sandboxes/${encodeURIComponent(sb.sandboxId)}/stop`, {});
    await loadSandboxes();
  }

  // ---- runs --------------------------------------------------------------------

  function exitOf(r) {
    return r.output && typeof r.output === 'object' && typeof r.output.exitCode === 'number' ? r.output.exitCode : null;
  }

  const TASKS = { 'run-sandbox-command': 'command', 'setup-sandbox': 'setup', 'coding-agent': 'agent' };

  async function loadRuns(selected, refreshing) {
    const data = await api('GET', '/api/tasks/runs?limit=50');
    const rows = (data.runs || []).map((r) => el('tr', {
      class: 'clickable' + (r.id === state.openRun ? ' selected' : ''),
      dataset: { run: r.id, status: r.status },
      onclick: () => { location.hash = '#runs/' + encodeURIComponent(r.id); },
    },
    el('td', { class: 'mono', text: r.id }),
    el('td', { class: 'nowrap', text: TASKS[r.taskIdentifier] || r.taskIdentifier, title: r.taskIdentifier }),
    el('td', null, statusBadge(r.status)),
    el('td', { class: 'nowrap', text: fmtShort(r.createdAt), title: fmtTime(r.createdAt) }),
    el('td', { class: 'nowrap', text: fmtDuration(r.durationMs) })));
    $('runs-body').replaceChildren(...rows);
    $('runs-empty').hidden = rows.length > 0;
    // While its log is followed, the open run's status comes from the
    // list; its end comes from the stream, once the whole log is shown.
    const open = (data.runs || []).find((r) => r.id === state.openRun);
    if (open && !open.isCompleted && state.runStream) showRunStatus(open);
    if (selected && !refreshing && selected !== state.openRun) openRun(selected);
    if (!selected) { stopRunStream(); $('run-detail').hidden = true; }
  }

  function stopRunStream() {
    if (state.runStream) state.runStream.abort();
    state.runStream = null;
    state.openRun = null;
  }

  // appendLog adds text to the run's log, keeping its last LOG_KEEP_CHARS.
  function appendLog(pre, text) {
    pre.append(document.createTextNode(stripEscapes(text)));
    let total = pre.textContent.length;
    while (total > LOG_KEEP_CHARS && pre.firstChild) {
      total -= pre.firstChild.textContent.length;
      pre.firstChild.remove();
    }
    pre.scrollTop = pre.scrollHeight;
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
    p.className = 'status st-' + String(r.status).toLowerCase();
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
    $('run-command').textContent = '';
    $('run-status').textContent = 'following the log…';
    $('run-status').dataset.status = '';
    let first;
    try {
      first = (await api('GET', '/api/tasks/runs?runId=' + encodeURIComponent(id))).runs[0];
    } catch (e) {
      $('run-status').textContent = e.message;
      return;
    }
    const p = first.payload || {};
    if (p.command) $('run-command').textContent = [p.command, ...(p.args || [])].join(' ');
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
          appendLog(pre, msg.data);
          // A run that logs has started (the list's refresh says more).
          if ($('run-status').dataset.status === 'QUEUED') {
            $('run-status').textContent = 'EXECUTING';
            $('run-status').dataset.status = 'EXECUTING';
            $('run-status').className = 'status st-executing';
            run(loadRuns(id, true));
          }
        }
        else if (name === 'error') appendLog(pre, `\n[${msg.error}]\n`);
      });
    } catch (e) {
      if (ctrl.signal.aborted) return;
      appendLog(pre, `\n[the log stream broke: ${e.message}]\n`);
    }
    if (state.runStream !== ctrl) return;
    // The stream ended with the run: show how it ended, and its output
    // when it had no log (a task's run, or a pruned log).
    const r = (await api('GET', '/api/tasks/runs?runId=' + encodeURIComponent(id))).runs[0];
    if (state.runStream !== ctrl) return;
    if (!got && r.output && typeof r.output === 'object') {
      if (r.output.stdout) appendLog(pre, r.output.stdout);
      if (r.output.stderr) appendLog(pre, r.output.stderr);
      if (!r.output.stdout && !r.output.stderr) appendLog(pre, JSON.stringify(r.output, null, 2));
    }
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
      el('td', { class: 'mono', text: s.sandbox_id || '—' }),
      el('td', { class: 'mono', text: short(s.parent_id), title: s.parent_id || 'the base image' }),
      el('td', { text: String(s.depth) }),
      el('td', { text: fmtBytes(s.size) }),
      el('td', null, s.current ? el('span', { class: 'badge st-running', text: 'current' }) : null)));
    $('snapshots-body').replaceChildren(...rows);
    if (!rows.length) $('snapshots-body').append(el('tr', null, el('td', { colSpan: 7, class: 'note', text: 'No snapshots yet: one is taken after each run.' })));
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
    const pre = $('term');
    pre.textContent = t;
    pre.scrollTop = pre.scrollHeight;
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
    $('term').textContent = '';
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
      $('term-state').textContent = e.code === 1000 ? 'disconnected' : `disconnected (${e.code}${e.reason ? ': ' + e.reason : ''})`;
      $('term-disconnect').disabled = true;
      if (state.key) run(loadTerminal());
    };
  }

  function disconnectTerminal() {
    const ws = state.ws;
    state.ws = null;
    if (ws) ws.close(1000);
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
    $('new-kind').addEventListener('change', () => {
      const kind = $('new-kind').value;
      $('new-command').disabled = kind === 'none';
      $('new-command').placeholder = kind === 'prompt' ? 'create a hello world index.html' : 'echo hello > hello.txt';
    });
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
    route();
  });
})();
