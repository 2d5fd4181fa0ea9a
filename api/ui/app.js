// The csiactor web UI: reads the agent's JSON API and follows its event
// stream; the only writes are a forced release and a fence, each after a
// confirmation. Everything shown is built with DOM calls (never HTML
// strings), so nothing from the agent is interpreted as markup.

const main = document.getElementById('main');
const state = { plugins: [], volumes: [], nodes: null, events: [] };
const maxEvents = 500;
let logStreams = null; // AbortController of the plugin page's log streams
let logs = new Map(); // allocation ID -> lines shown on the plugin page
let signedIn = false;
// session is the signed-in token's {name, scope} (GET /v1/whoami): the
// forced release and the fence are offered to an operator session only,
// as the agent refuses them to the others (403).
let session = null;
const canOperate = () => session !== null && session.scope === 'operator';

function h(tag, props = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v == null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat(Infinity)) {
    if (k != null && k !== false) el.append(k instanceof Node ? k : String(k));
  }
  return el;
}

class HTTPError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, init = {}) {
  const r = await fetch(path, { credentials: 'same-origin', ...init });
  if (!r.ok) {
    let msg = r.statusText;
    try { msg = (await r.json()).error || msg; } catch { /* not JSON */ }
    throw new HTTPError(r.status, msg);
  }
  return r.status === 204 ? null : r.json();
}

// ndjson calls fn with each JSON line of the stream at path until it ends
// or signal aborts; it returns the response status.
async function ndjson(path, signal, fn, onOpen) {
  const r = await fetch(path, { credentials: 'same-origin', signal });
  if (!r.ok) return r.status;
  if (onOpen) onOpen();
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return r.status;
    buf += value;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line) fn(JSON.parse(line));
    }
  }
}

const fmtBytes = (n) => {
  if (!n) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${u[i]}`;
};
const fmtTime = (t) => (t ? new Date(t).toLocaleTimeString() : '');
const link = (kind, id) => h('a', { href: `#/${kind}/${encodeURIComponent(id)}` }, id);
const table = (heads, rows, empty) => rows.length
  ? h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, heads.map((t) => h('th', typeof t === 'string' ? {} : t[1], typeof t === 'string' ? t : t[0])))), h('tbody', {}, rows)))
  : h('p', { class: 'muted' }, empty);
const badge = (cls, text, props = {}) => h('span', { class: `badge ${cls}`, ...props }, text);

function pluginHealth(p) {
  const healthy = p.controllers_healthy + p.nodes_healthy;
  const expected = p.controllers_expected + p.nodes_expected;
  if (expected > 0 && p.controllers_healthy >= p.controllers_expected && p.nodes_healthy >= p.nodes_expected) return 'healthy';
  return healthy > 0 ? 'degraded' : 'unhealthy';
}
const healthClass = { healthy: 'ok', degraded: 'warn', unhealthy: 'bad' };

// A stalled claim and a broken mount (dead, being mounted again) both want
// an operator's look: they are shown alike.
const alarming = (c) => c.condition === 'stalled' || c.condition === 'broken';
// alarm is the condition a volume is flagged with: broken before stalled.
const alarm = (v) => {
  const cs = [...(v.claims || []), ...(v.past_claims || [])];
  return cs.some((c) => c.condition === 'broken') ? 'broken' : cs.some(alarming) ? 'stalled' : '';
};

function claimChip(c, past) {
  const cls = `chip${alarming(c) ? ' stalled' : ''}`;
  return h('li', { class: cls, 'data-claim': c.alloc, 'data-state': c.state, title: c.last_error || '' },
    `${past ? 'past: ' : ''}${c.alloc} · ${c.state === 'remote' ? `on ${c.host}` : c.condition || c.state}`);
}

// claimChips lists a volume's claims and past claims as chips: a list
// (for screen readers) whose items are apart in its text too (for
// copy-paste), not "a · publishedb · published".
function claimChips(v) {
  const chips = [...(v.claims || []).map((c) => claimChip(c, false)), ...(v.past_claims || []).map((c) => claimChip(c, true))];
  if (!chips.length) return h('span', { class: 'muted' }, 'none');
  return h('ul', { class: 'chips', role: 'list', 'aria-label': 'claims' }, chips.flatMap((c, i) => (i ? [' ', c] : [c])));
}

// noStats is what a volume's usage or condition (kind) shows without a
// value: the API's usage_status or condition_status says whether the
// agent has not polled it yet or the plugin never reports it.
function noStats(kind, status) {
  if (status === 'pending') return h('span', { class: 'muted', [`data-${kind}`]: status, title: 'not measured yet: the agent polls it every volumes.stats_interval' }, 'pending');
  if (status === 'unsupported') return h('span', { class: 'muted', [`data-${kind}`]: status, title: "the volume's plugin does not report it" }, 'not supported');
  return h('span', { class: 'muted' }, '–');
}

function usage(v) {
  const u = v.usage;
  if (!u || !u.capacity_bytes) return noStats('usage', v.usage_status);
  return h('span', {},
    h('meter', { min: 0, max: u.capacity_bytes, value: u.used_bytes || 0, high: u.capacity_bytes * 0.9, optimum: 0 }),
    ' ', `${fmtBytes(u.used_bytes)} / ${fmtBytes(u.capacity_bytes)}`);
}

function condition(v) {
  if (!v.condition) return noStats('condition', v.condition_status);
  return v.condition.abnormal ? badge('bad', `abnormal: ${v.condition.message || ''}`) : badge('ok', 'normal');
}

function flash(msg, bad) {
  const f = document.getElementById('flash');
  f.textContent = msg;
  f.className = bad ? 'bad' : '';
  f.hidden = false;
}

// The dialog's answer goes straight to the question asked, never through
// its close event: that event is queued, and one from a canceled dialog
// could otherwise answer the next question.
let confirmAnswer = null;
function confirmAction(title, text, label) {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = label;
  dlg.showModal();
  return new Promise((resolve) => { confirmAnswer = resolve; });
}

function answerConfirm(ok) {
  document.getElementById('confirm').close();
  const answer = confirmAnswer;
  confirmAnswer = null;
  if (answer) answer(ok);
}

async function act(title, text, label, method, path) {
  if (!await confirmAction(title, text, label)) return;
  try {
    await api(path, { method, headers: { 'X-Csiactor-UI': '1' } });
    flash(`${title}: done.`);
  } catch (e) {
    flash(`${title}: ${e.message}`, true);
  }
  refresh();
}

const forceRelease = (v, c) => act('Force release',
  `Forget ${c.alloc}'s claim on volume ${v.id} after one last best-effort teardown? Whatever that teardown cannot undo (a mount, a staging, an attachment) is left on the host or the storage.`,
  'Force release', 'DELETE', `/v1/volumes/${encodeURIComponent(v.id)}/claims/${encodeURIComponent(c.alloc)}?force=true`);

const fence = (n) => act('Fence host',
  `Take every claim of the down host ${n.id} away from it, unpublishing its volumes through their controllers?`,
  'Fence', 'POST', `/v1/nodes/${encodeURIComponent(n.id)}/fence`);

function overview() {
  const out = [];
  if (state.nodes) {
    out.push(h('section', { id: 'hosts' }, h('h2', {}, 'Hosts'), table(['Host', 'Status', 'Claims', 'Last seen', ''],
      state.nodes.map((n) => h('tr', { 'data-node': n.id, 'data-status': n.status, 'data-claims': String(n.claims) },
        h('td', {}, n.id, n.self ? h('span', { class: 'muted' }, ' (this agent)') : ''),
        h('td', {}, badge(n.status === 'up' ? 'ok' : 'bad', n.status)),
        h('td', {}, n.claims), h('td', {}, fmtTime(n.last_seen)),
        h('td', {}, n.status !== 'up' && !n.self && canOperate() ? h('button', { class: 'danger', type: 'button', onclick: () => fence(n) }, 'Fence…') : ''))),
      'No hosts.')));
  }
  out.push(h('section', { id: 'plugins' }, h('h2', {}, 'Plugins'), table(['Plugin', 'Health', ['Controllers', { class: 'wide' }], 'Nodes', 'Singleton', ['Provider', { class: 'wide' }], ['Version', { class: 'wide' }]],
    state.plugins.map((p) => {
      const health = pluginHealth(p);
      const singles = (p.allocations || []).filter((a) => a.singleton).map((a) => `${a.id} (${a.type})`);
      return h('tr', { 'data-plugin': p.name, 'data-health': health },
        h('td', {}, link('plugin', p.name)), h('td', {}, badge(healthClass[health], health)),
        h('td', { class: 'wide' }, `${p.controllers_healthy}/${p.controllers_expected}`),
        h('td', {}, `${p.nodes_healthy}/${p.nodes_expected}`),
        h('td', {}, singles.join(', ') || '–'), h('td', { class: 'wide provider' }, p.provider || '–'), h('td', { class: 'wide version' }, p.version || '–'));
    }), 'No plugins registered.')));
  out.push(h('section', { id: 'volumes' }, h('h2', {}, 'Volumes'), table(['Volume', ['Plugin', { class: 'wide' }], 'Claims', 'Usage', 'Condition'],
    state.volumes.map((v) => h('tr', { 'data-volume': v.id, class: alarm(v) ? 'stalled' : null },
      h('td', {}, link('volume', v.id), alarm(v) ? h('span', {}, ' ', badge('warn', alarm(v))) : ''),
      h('td', { class: 'wide' }, v.plugin),
      h('td', {}, claimChips(v)),
      h('td', {}, usage(v)), h('td', {}, condition(v)))),
    'No volumes registered.')));
  return out;
}

function claimRows(v, claims) {
  return claims.map((c) => h('tr', { 'data-claim': c.alloc, 'data-state': c.state, class: alarming(c) ? 'stalled' : null },
    h('td', {}, c.alloc), h('td', {}, c.host || '–'),
    h('td', {}, `${c.mode} ${c.access_mode} ${c.attachment_mode}${c.read_only ? ' read-only' : ''}`),
    h('td', {}, c.state, c.condition ? h('span', {}, ' ', badge(alarming(c) ? 'warn' : 'bad', c.condition)) : '',
      // What a repair redoes, and why: "target path broken (ENOTCONN)".
      c.repair ? h('div', { class: 'muted', 'data-repair': c.repair }, c.repair) : ''),
    h('td', { class: 'error' }, c.last_error || ''),
    // Another host's claim is released there, or fenced with its host.
    h('td', {}, c.state === 'remote' || !canOperate() ? '' : h('button', { class: 'danger', type: 'button', onclick: () => forceRelease(v, c) }, 'Force release…'))));
}

function eventRows(evs) {
  return evs.slice().reverse().map((e) => h('tr', { 'data-event': e.type },
    h('td', {}, fmtTime(e.time)), h('td', {}, e.type), h('td', {}, e.alloc || e.plugin || ''), h('td', {}, e.message)));
}

function volumePage(id) {
  const v = state.volumes.find((x) => x.id === id);
  if (!v) return [h('h1', {}, id), h('p', { class: 'muted' }, 'No such volume.')];
  const mo = v.mount_options;
  const heads = ['Allocation', 'Host', 'Mode', 'State', 'Last error', ''];
  return [
    h('h1', {}, `Volume ${v.id}`),
    h('section', {}, h('dl', {},
      h('dt', {}, 'Plugin'), h('dd', {}, link('plugin', v.plugin)),
      h('dt', {}, 'External ID'), h('dd', {}, v.external_id),
      h('dt', {}, 'Capacity'), h('dd', {}, fmtBytes(v.capacity_bytes)),
      h('dt', {}, 'Capabilities'), h('dd', {}, (v.capabilities || []).map((c) => `${c.access_mode} ${c.attachment_mode}`).join(', ')),
      mo ? [h('dt', {}, 'Mount options'), h('dd', {}, `${mo.fs_type || 'default fs'}, ${mo.mount_flag_count || 0} mount flags (not shown)`)] : [],
      h('dt', {}, 'Usage'), h('dd', {}, usage(v)),
      h('dt', {}, 'Condition'), h('dd', {}, condition(v)))),
    h('section', { id: 'claims' }, h('h2', {}, 'Claims'), table(heads, claimRows(v, v.claims || []), 'No claims.')),
    h('section', { id: 'past-claims' }, h('h2', {}, 'Past claims'), table(heads, claimRows(v, v.past_claims || []), 'No past claims.')),
    h('section', { id: 'events' }, h('h2', {}, 'Events'), table(['Time', 'Event', 'Allocation', 'Message'], eventRows(state.events.filter((e) => e.volume === id)), 'No recent events.')),
  ];
}

function followLogs(p) {
  if (logStreams && logStreams.plugin === p.name) return;
  if (logStreams) logStreams.abort();
  logStreams = new AbortController();
  logStreams.plugin = p.name;
  logs = new Map();
  for (const a of p.allocations || []) {
    if (!a.command) continue; // attached: its output is not the agent's
    const lines = [];
    logs.set(a.id, lines);
    ndjson(`/v1/allocations/${encodeURIComponent(a.id)}/logs?follow=true&tail=100`, logStreams.signal, (l) => {
      lines.push(`${fmtTime(l.time)} ${l.line}`);
      if (lines.length > 200) lines.splice(0, lines.length - 200);
      const pre = document.querySelector(`pre[data-logs="${CSS.escape(a.id)}"]`);
      if (pre) { pre.textContent = lines.join('\n'); pre.scrollTop = pre.scrollHeight; }
    }).catch(() => { /* aborted, or the agent went away */ });
  }
}

function caps(c) {
  if (!c) return h('span', { class: 'muted' }, 'not fingerprinted yet');
  const list = (name, xs) => (xs && xs.length ? [h('dt', {}, name), h('dd', {}, xs.join(', '))] : []);
  return h('dl', {}, list('Plugin', c.plugin), list('Controller', c.controller), list('Node', c.node),
    c.topology ? [h('dt', {}, 'Topology'), h('dd', {}, Object.entries(c.topology).map(([k, v]) => `${k}=${v}`).join(', '))] : [],
    c.max_volumes_per_node ? [h('dt', {}, 'Max volumes'), h('dd', {}, c.max_volumes_per_node)] : []);
}

function pluginPage(name) {
  const p = state.plugins.find((x) => x.name === name);
  if (!p) return [h('h1', {}, name), h('p', { class: 'muted' }, 'No such plugin.')];
  followLogs(p);
  const health = pluginHealth(p);
  const allocs = p.allocations || [];
  return [
    h('h1', {}, `Plugin ${p.name} `, badge(healthClass[health], health, { 'data-health': health })),
    h('section', {}, h('dl', {},
      h('dt', {}, 'Provider'), h('dd', {}, p.provider || '–'),
      h('dt', {}, 'Version'), h('dd', {}, p.version || '–'),
      h('dt', {}, 'Controller'), h('dd', {}, p.controller_required ? 'required (claims go through ControllerPublishVolume)' : 'not required'),
      h('dt', {}, 'Volumes'), h('dd', {}, state.volumes.filter((v) => v.plugin === name).map((v) => [link('volume', v.id), ' '])))),
    h('section', { id: 'allocations' }, h('h2', {}, 'Allocations'), table(['Allocation', 'Type', 'Health', 'Singleton', ['Node ID', { class: 'wide' }], ['Source', { class: 'wide' }], ['PID', { class: 'wide' }]],
      allocs.map((a) => h('tr', { 'data-alloc': a.id, 'data-healthy': String(a.healthy) },
        h('td', {}, a.id), h('td', {}, a.type),
        h('td', {}, badge(a.healthy ? 'ok' : 'bad', a.healthy ? 'healthy' : 'unhealthy'), ' ', h('span', { class: 'muted' }, a.health_description || '')),
        h('td', {}, a.singleton ? 'yes' : ''), h('td', { class: 'wide' }, a.node_id || ''),
        h('td', { class: 'wide' }, a.source || ''), h('td', { class: 'wide' }, a.pid || ''))),
      'No allocations.')),
    h('section', { id: 'capabilities' }, h('h2', {}, 'Capabilities'), allocs.map((a) => [h('h3', {}, a.id), caps(a.capabilities)])),
    h('section', { id: 'logs' }, h('h2', {}, 'Logs'), allocs.filter((a) => a.command).map((a) => [
      h('h3', {}, a.id), h('pre', { class: 'logs', 'data-logs': a.id }, (logs.get(a.id) || []).join('\n'))]),
    allocs.some((a) => a.command) ? '' : h('p', { class: 'muted' }, 'Attached allocations only: their output is not kept by the agent.')),
    h('section', { id: 'events' }, h('h2', {}, 'Events'), table(['Time', 'Event', 'Allocation', 'Message'], eventRows(state.events.filter((e) => e.plugin === name)), 'No recent events.')),
  ];
}

// patch makes cur's children look like next's, keeping every node whose
// markup is unchanged: a retrying claim sends several events a second, and
// a button the operator is about to click must not be replaced because a
// row of the events table changed. An element with other attributes, or a
// list of another length, is replaced whole.
function patch(cur, next) {
  const old = [...cur.childNodes];
  const kids = [...next.childNodes];
  if (old.length !== kids.length) { cur.replaceChildren(...kids); return; }
  old.forEach((n, i) => {
    const m = kids[i];
    if (n.isEqualNode(m)) return;
    if (n.nodeType === Node.ELEMENT_NODE && m.nodeType === Node.ELEMENT_NODE && n.tagName === m.tagName && sameAttributes(n, m)) patch(n, m);
    else n.replaceWith(m);
  });
}

function sameAttributes(a, b) {
  return a.attributes.length === b.attributes.length && [...a.attributes].every((x) => b.getAttribute(x.name) === x.value);
}

function render() {
  if (!signedIn) return;
  const [, kind, id] = (location.hash.match(/^#\/(volume|plugin)\/(.+)$/) || []).map((x) => x && decodeURIComponent(x));
  if (kind !== 'plugin' && logStreams) { logStreams.abort(); logStreams = null; }
  const page = kind === 'volume' ? volumePage(id) : kind === 'plugin' ? pluginPage(id) : overview();
  document.body.dataset.page = kind || 'overview';
  const next = document.createElement('div');
  next.append(...page);
  if (next.innerHTML === main.innerHTML) return;
  const y = window.scrollY;
  patch(main, next);
  window.scrollTo(0, y);
  document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
}

// load reads the agent's state. The volumes carry every host's claims
// (all_hosts: one etcd read in cluster mode; other hosts' claims are in
// state remote, with their host).
//
// The hosts are asked for in cluster mode only, which GET /v1/health says
// (asked once): a single host answers /v1/nodes with a 404, which the
// browser would log at every refresh.
let cluster = null;
async function load() {
  if (cluster === null) cluster = (await api('/v1/health')).cluster === true;
  const [plugins, volumes, nodes] = await Promise.all([api('/v1/plugins'), api('/v1/volumes?all_hosts=true'),
    cluster ? api('/v1/nodes') : null]);
  Object.assign(state, { plugins, volumes, nodes });
}

let refreshing = null;
let again = false;
function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = (async () => {
    do {
      again = false;
      try { await load(); render(); } catch (e) { if (e.status === 401) { showLogin(); return; } flash(`Cannot read the agent: ${e.message}`, true); }
    } while (again);
  })().finally(() => { refreshing = null; });
}

async function follow() {
  const live = document.getElementById('live');
  for (;;) {
    let status = 0;
    try {
      status = await ndjson('/v1/events?follow=true', undefined, (ev) => {
        state.events.push(ev);
        if (state.events.length > maxEvents) state.events.splice(0, state.events.length - maxEvents);
        refresh();
      }, () => { state.events = []; live.dataset.live = 'true'; live.textContent = 'live'; refresh(); });
    } catch { /* the agent went away */ }
    live.dataset.live = 'false';
    live.textContent = 'offline';
    if (status === 401) { showLogin(); return; }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

function showLogin(message) {
  signedIn = false;
  session = null;
  document.getElementById('whoami').hidden = true;
  document.getElementById('logout').hidden = true;
  // Whether the event stream is live means nothing before signing in.
  document.getElementById('live').hidden = true;
  const input = h('input', { type: 'password', name: 'token', autocomplete: 'current-password', placeholder: 'API token', 'aria-label': 'API token', required: true });
  const err = h('p', { class: 'bad', id: 'login-error' }, message || '');
  // POST, so that the token could never end up in an URL.
  const form = h('form', {
    class: 'login',
    method: 'post',
    onsubmit: async (e) => {
      e.preventDefault();
      try {
        await api('/ui/login', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token: input.value }) });
        start();
      } catch (x) {
        err.textContent = x.status === 401 ? 'Wrong token.' : x.message;
        input.value = '';
      }
    },
  }, input, h('button', { type: 'submit' }, 'Sign in'));
  main.replaceChildren(h('h1', {}, 'Sign in'), h('p', {}, "Give an API token of the agent (api.token_file or api.tokens); the UI offers what its scope allows. It is kept as a session cookie."), form, err);
  document.body.dataset.page = 'login';
  input.focus();
}

async function start() {
  try {
    await load();
    session = await api('/v1/whoami');
  } catch (e) {
    if (e.status === 401) { showLogin(); return; }
    main.replaceChildren(h('h1', {}, 'No access'), h('p', {}, e.message));
    document.body.dataset.page = 'error';
    return;
  }
  signedIn = true;
  const who = document.getElementById('whoami');
  who.textContent = `signed in as ${session.name} (${session.scope})`;
  who.hidden = false;
  document.getElementById('logout').hidden = false;
  document.getElementById('live').hidden = false;
  render();
  follow();
}

// Usage and condition are polled by the agent without an event: read
// them again now and then.
setInterval(() => { if (signedIn) refresh(); }, 5000);

document.getElementById('confirm-cancel').addEventListener('click', () => answerConfirm(false));
document.getElementById('confirm-ok').addEventListener('click', () => answerConfirm(true));
// Escape cancels the dialog: its cancel event comes before it closes.
document.getElementById('confirm').addEventListener('cancel', () => answerConfirm(false));
document.getElementById('logout').addEventListener('click', async () => {
  await api('/ui/logout', { method: 'POST' });
  location.reload();
});
window.addEventListener('hashchange', render);
start();
