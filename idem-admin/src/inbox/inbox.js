// The operator inbox: calls waiting for a person's approval, escalations,
// and sagas. Everything shown comes from the admin API of the process
// that served this page; tool arguments, reasons, notes and provider errors
// are data, never markup: the page only ever sets textContent.
"use strict";

const TOKEN_KEY = "idem-admin-token";
const $ = (sel, root = document) => root.querySelector(sel);

const state = {
  token: null,
  tools: new Map(),     // name -> ToolInfo
  cards: new Map(),     // key -> <li> (escalations)
  approvals: new Map(), // key -> <li> (calls awaiting approval)
  refreshing: null,
  refreshAgain: false,
  following: null,      // AbortController of the followed stream
  cardSeq: 0,
};

// ---- token -----------------------------------------------------------------

function takeToken() {
  // #token=... (or ?token=...) in the address, once: kept in this tab only.
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  const fromQuery = new URLSearchParams(location.search).get("token");
  const given = fromHash || fromQuery;
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

function askForToken(message) {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.following) state.following.abort();
  $("#inbox").hidden = true;
  $("#login").hidden = false;
  setStatus("not signed in", "down");
  if (message) showBanner(message);
  $("#token").focus();
}

// ---- API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers, {
    Authorization: "Bearer " + state.token,
  });
  let answer;
  try {
    answer = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  } catch (e) {
    throw new ApiError(0, "unreachable", "the process does not answer: " + e.message);
  }
  if (answer.status === 401) {
    askForToken("The admin API refused the token. Enter the one from the journal directory.");
    throw new ApiError(401, "unauthorized", "the admin API refused the token");
  }
  if (!answer.ok) {
    let body = null;
    try { body = await answer.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(
      answer.status,
      body && body.error ? body.error : "http_" + answer.status,
      body && body.message ? body.message : answer.status + " " + answer.statusText,
    );
  }
  return answer.json();
}

// ---- status ----------------------------------------------------------------

function setStatus(text, kind) {
  const s = $("#status");
  s.textContent = text;
  s.className = kind || "";
}

function showBanner(text) {
  const b = $("#banner");
  b.textContent = text;
  b.hidden = !text;
}

// ---- rendering -------------------------------------------------------------

function fmtTime(ms) {
  if (!ms) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.(\d{3})Z$/, ".$1 UTC");
}

function fmtAgo(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " days ago";
}

function text(el, value) {
  el.textContent = value == null || value === "" ? "-" : String(value);
}

const REDACTED = "<redacted>";

// The record's arguments, one row each, the values as JSON; a redacted one
// is shown as the record holds it (its value was never written).
function fillArgs(rows, given) {
  const args = given && typeof given === "object" && !Array.isArray(given) ? given : { "": given };
  for (const [name, value] of Object.entries(args)) {
    const tr = document.createElement("tr");
    const k = document.createElement("td");
    const v = document.createElement("td");
    k.textContent = name;
    if (value === REDACTED) {
      v.textContent = REDACTED;
      v.className = "redacted";
      v.title = "redacted: the journal never stored its value";
    } else {
      v.textContent = JSON.stringify(value);
    }
    tr.append(k, v);
    rows.append(tr);
  }
}

function newCard(e) {
  const li = $("#card").content.firstElementChild.cloneNode(true);
  const n = ++state.cardSeq;
  li.dataset.key = e.key;
  li.dataset.tool = e.tool;
  text($(".tool", li), e.tool);
  text($(".class", li), e.class);
  text($(".key", li), e.key);
  text($(".reason", li), e.reason);
  const scope = e.scope && e.scope.length ? " / " + e.scope.join("/") : "";
  text($(".run", li), e.root_run + scope);
  fillArgs($(".args tbody", li), e.args);
  text($(".attempts", li), e.attempts);
  text($(".last-error", li), e.last_error);
  text($(".verify", li), e.verify_answer || (e.class === "at_most_once"
    ? "- (at_most_once: nothing can look it up)" : "- (not asked)"));
  text($(".first", li), fmtTime(e.first_attempt_ms));
  text($(".escalated", li), fmtTime(e.escalated_ms));
  text($(".when", li), "escalated " + fmtAgo(e.escalated_ms));

  const form = $(".resolve", li);
  for (const radio of form.querySelectorAll('input[type="radio"]')) {
    radio.name = "resolution-" + n;
    radio.addEventListener("change", () => {
      $(".landed", li).hidden = radio.value !== "landed" || !radio.checked;
    });
  }
  fillExample(li);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    submit(li).catch((err) => showError(li, err.message));
  });
  return li;
}

// The Landed editor starts from an example of the tool's result shape: its
// latest committed result, when the journal has one.
function fillExample(li) {
  const tool = state.tools.get(li.dataset.tool);
  const area = $(".result", li);
  const hint = $(".hint", li);
  if (tool && tool.example_result) {
    if (!area.value) area.value = JSON.stringify(tool.example_result.result, null, 2);
    hint.textContent = "Pre-filled with the latest committed result of " + tool.name +
      " (" + tool.example_result.key + ") as an example of its shape: replace it with what " +
      "the provider's records show for this operation.";
  } else {
    if (!area.value) area.value = "null";
    hint.textContent = "No committed result of this tool yet: write the provider's answer " +
      "as JSON, in the tool's result type.";
  }
  if (tool && !tool.checks_landed) {
    hint.textContent += " This process cannot check a result for this tool, so it will refuse Landed.";
  }
}

function showError(li, message) {
  const box = $(".error", li);
  box.textContent = message;
  box.hidden = false;
}

async function submit(li) {
  const form = $(".resolve", li);
  const box = $(".error", li);
  box.hidden = true;
  const chosen = form.querySelector('input[type="radio"]:checked');
  if (!chosen) return showError(li, "Choose Landed, Reissue or Abandon.");
  const note = $(".note", li).value.trim();
  if (!note) return showError(li, "A note is required: say what the decision rests on.");
  const body = { resolution: chosen.value, note };
  if (chosen.value === "landed") {
    try {
      body.result = JSON.parse($(".result", li).value);
    } catch (e) {
      return showError(li, "The result is not valid JSON: " + e.message + ". Nothing was sent.");
    }
  }
  const button = $("button", form);
  button.disabled = true;
  try {
    const done = await api("/v1/ops/" + encodeURIComponent(li.dataset.key) + "/resolve", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    li.classList.add("resolved");
    $(".done", li).textContent = "Resolved as " + done.resolution + ": the operation is now " +
      done.operation.state + ".";
    for (const el of form.querySelectorAll("input, textarea, button")) el.disabled = true;
  } catch (e) {
    button.disabled = false;
    if (e.status !== 401) showError(li, e.message + (e.code ? " [" + e.code + "]" : ""));
  }
}

function render(escalations) {
  const list = $("#escalations");
  const open = new Set(escalations.map((e) => e.key));
  for (const [key, li] of state.cards) {
    // A card being answered stays until its answer is shown.
    if (!open.has(key) && !li.classList.contains("resolved")) {
      li.remove();
      state.cards.delete(key);
    }
  }
  // Newest first.
  const sorted = escalations.slice().sort((a, b) => b.escalated_ms - a.escalated_ms);
  let previous = null;
  for (const e of sorted) {
    let li = state.cards.get(e.key);
    if (!li) {
      li = newCard(e);
      state.cards.set(e.key, li);
    } else {
      fillExample(li);
      text($(".when", li), "escalated " + fmtAgo(e.escalated_ms));
    }
    if (previous) previous.after(li); else list.prepend(li);
    previous = li;
  }
  const n = escalations.length;
  $("#summary").textContent = n === 0
    ? "No escalations waiting."
    : n + (n === 1 ? " operation waits" : " operations wait") +
      " for an operator, newest first. Check the provider's own records, then answer.";
}

// ---- approvals --------------------------------------------------------------

function newApprovalCard(a) {
  const li = $("#approval-card").content.firstElementChild.cloneNode(true);
  li.dataset.key = a.key;
  li.dataset.tool = a.tool;
  text($(".tool", li), a.tool);
  text($(".class", li), a.class);
  text($(".key", li), a.key);
  text($(".reason", li), a.reason);
  const scope = a.scope && a.scope.length ? " / " + a.scope.join("/") : "";
  text($(".run", li), a.root_run + scope);
  fillArgs($(".args tbody", li), a.args);
  text($(".asked", li), fmtTime(a.requested_ms));
  text($(".when", li), "asked " + fmtAgo(a.requested_ms));
  $(".decide", li).addEventListener("submit", (ev) => ev.preventDefault());
  for (const [button, approved] of [[$(".approve", li), true], [$(".reject", li), false]]) {
    button.addEventListener("click", () => {
      decide(li, approved).catch((err) => showError(li, err.message));
    });
  }
  return li;
}

// Approve or reject through the API, which is the authority on what a
// decision needs: the page only refuses to send a blank note (both need
// one) and shows the API's refusals as they come.
async function decide(li, approved) {
  const box = $(".error", li);
  box.hidden = true;
  const note = $(".note", li).value.trim();
  if (!note) {
    return showError(li, "A note is required to " + (approved ? "approve" : "reject") +
      ": say what you checked" + (approved ? "." : " (the agent reads it).") + " Nothing was sent.");
  }
  const buttons = li.querySelectorAll("button");
  for (const b of buttons) b.disabled = true;
  try {
    const done = await api("/v1/ops/" + encodeURIComponent(li.dataset.key) +
      (approved ? "/approve" : "/reject"), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ note, via: "inbox" }),
    });
    removeApproval(li.dataset.key);
    $("#approvals-done").textContent = (done.decision === "approved"
      ? "Approved " + li.dataset.tool + " " + done.key + ": its next call runs it."
      : "Rejected " + li.dataset.tool + " " + done.key + ": its calls return the note.");
    renderApprovalsSummary();
  } catch (e) {
    for (const b of buttons) b.disabled = false;
    if (e.status !== 401) showError(li, e.message + (e.code ? " [" + e.code + "]" : ""));
  }
}

function removeApproval(key) {
  const li = state.approvals.get(key);
  if (li) li.remove();
  state.approvals.delete(key);
}

function renderApprovals(approvals) {
  const list = $("#approvals");
  const open = new Set(approvals.map((a) => a.key));
  // Decided elsewhere (the CLI, the API, the runtime): gone.
  for (const key of Array.from(state.approvals.keys())) {
    if (!open.has(key)) removeApproval(key);
  }
  // Oldest request first: the longest waiting agent at the top.
  const sorted = approvals.slice().sort((a, b) => a.requested_ms - b.requested_ms);
  let previous = null;
  for (const a of sorted) {
    let li = state.approvals.get(a.key);
    if (!li) {
      li = newApprovalCard(a);
      state.approvals.set(a.key, li);
    } else {
      text($(".when", li), "asked " + fmtAgo(a.requested_ms));
    }
    if (previous) previous.after(li); else list.prepend(li);
    previous = li;
  }
  renderApprovalsSummary();
}

function renderApprovalsSummary() {
  const n = state.approvals.size;
  $("#approvals-summary").textContent = n === 0
    ? "No approvals waiting."
    : n + (n === 1 ? " call waits" : " calls wait") +
      " for a person's approval, oldest first. Nothing ran: approve to run it once, " +
      "or reject with a note the agent reads.";
}

// ---- sagas -------------------------------------------------------------------

// Escalated sagas first (they need a person), then those compensating, then
// the rest by their latest change; at most SAGAS_SHOWN of the rest.
const SAGA_ORDER = { escalated: 0, compensating: 1, compensated: 2, running: 3 };
const SAGAS_SHOWN = 50;

function sagaUpdated(g) {
  return g.ended_ms || g.decided_ms || g.started_ms || 0;
}

function fillSteps(list, steps) {
  if (!steps || steps.length === 0) {
    const li = document.createElement("li");
    li.textContent = "-";
    list.append(li);
    list.classList.add("empty");
    return;
  }
  for (const step of steps) {
    const li = document.createElement("li");
    li.textContent = step.tool + " " + step.key;
    list.append(li);
  }
}

function sagaAdvice(g) {
  switch (g.state) {
    case "escalated":
      return g.for_good
        ? "Escalated for good: a compensation was refused or could not run. Undo what is left by hand (the escalation names it)."
        : "Escalated for now: a compensation cannot be settled yet. Settle its own escalation above; the saga's next run resumes the rollback.";
    case "compensating":
      return "Compensating: a rollback is decided; its compensations run, or its next run goes on with them.";
    case "compensated":
      return "Compensated: every completed step was undone.";
    default:
      return "Running: no rollback decided (or it finished with its value).";
  }
}

function newSagaCard(g) {
  const li = $("#saga-card").content.firstElementChild.cloneNode(true);
  li.dataset.key = g.key;
  li.dataset.state = g.state;
  li.classList.add(g.state);
  if (g.state === "escalated" && g.for_good) li.classList.add("for-good");
  text($(".name", li), g.saga);
  text($(".state", li), g.state === "escalated" && !g.for_good ? "escalated for now" : g.state);
  text($(".key", li), g.key);
  text($(".advice", li), sagaAdvice(g));
  const scope = g.scope && g.scope.length ? " / " + g.scope.join("/") : "";
  text($(".run", li), g.root_run + scope);
  text($(".reason", li), g.reason);
  fillSteps($(".steps", li), g.steps);
  fillSteps($(".undone", li), g.undone);
  text($(".escalation", li), g.escalation);
  text($(".started", li), fmtTime(g.started_ms));
  text($(".decided", li), fmtTime(g.decided_ms));
  text($(".ended", li), fmtTime(g.ended_ms));
  text($(".when", li), "updated " + fmtAgo(sagaUpdated(g)));
  return li;
}

// Sagas take no answer in the page: the list is rebuilt on every refresh.
function renderSagas(sagas) {
  const sorted = sagas.slice().sort((a, b) =>
    (SAGA_ORDER[a.state] ?? 4) - (SAGA_ORDER[b.state] ?? 4) || sagaUpdated(b) - sagaUpdated(a));
  const urgent = sorted.filter((g) => g.state === "escalated" || g.state === "compensating");
  const rest = sorted.filter((g) => g.state !== "escalated" && g.state !== "compensating");
  const shown = urgent.concat(rest.slice(0, SAGAS_SHOWN));
  $("#sagas").replaceChildren(...shown.map(newSagaCard));
  const count = (state) => sagas.filter((g) => g.state === state).length;
  let summary = sagas.length === 0
    ? "No sagas."
    : sagas.length + (sagas.length === 1 ? " saga: " : " sagas: ") + count("escalated") +
      " escalated, " + count("compensating") + " compensating, " + count("compensated") +
      " compensated, " + count("running") + " running. Escalated ones first.";
  if (rest.length > SAGAS_SHOWN) {
    summary += " Showing the " + SAGAS_SHOWN + " latest of the " + rest.length +
      " others (idem sagas lists them all).";
  }
  $("#sagas-summary").textContent = summary;
}

// ---- refresh ---------------------------------------------------------------

async function refresh() {
  // One refresh at a time; a request during one runs once more after it.
  if (state.refreshing) {
    state.refreshAgain = true;
    return state.refreshing;
  }
  state.refreshing = (async () => {
    do {
      state.refreshAgain = false;
      const [tools, escalations, approvals, sagas] = await Promise.all(
        [api("/v1/tools"), api("/v1/escalations"), api("/v1/approvals"), api("/v1/sagas")]);
      state.tools = new Map(tools.map((t) => [t.name, t]));
      renderApprovals(approvals);
      render(escalations);
      renderSagas(sagas);
      showBanner("");
    } while (state.refreshAgain);
  })();
  try {
    await state.refreshing;
  } catch (e) {
    if (e.status !== 401) {
      showBanner("Could not load the approvals, escalations and sagas: " + e.message);
    }
  } finally {
    state.refreshing = null;
  }
}

// ---- the audit stream ------------------------------------------------------

const WAKE = new Set(["escalated", "resolved", "amended", "committed", "intent", "recovered",
  "approval_requested", "approved", "not_approved",
  "saga_started", "compensating", "compensated", "saga_escalated"]);

async function follow() {
  if (!state.token) return;
  const controller = new AbortController();
  state.following = controller;
  try {
    const answer = await fetch("/v1/audit?from=end&follow=true", {
      headers: { Authorization: "Bearer " + state.token },
      signal: controller.signal,
      cache: "no-store",
    });
    if (answer.status === 401) return askForToken("The admin API refused the token.");
    if (!answer.ok) throw new Error(answer.status + " " + answer.statusText);
    // Subscribed from here on: load what exists now, then apply changes.
    setStatus("live: following the audit stream", "live");
    await refresh();
    const reader = answer.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let nl;
      let wake = false;
      while ((nl = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, nl);
        pending = pending.slice(nl + 1);
        if (!line) continue;
        const event = JSON.parse(line);
        if (event.error) throw new Error(event.message);
        const kind = typeof event.kind === "string" ? event.kind : Object.keys(event.kind)[0];
        if (WAKE.has(kind)) wake = true;
      }
      if (wake) refresh();
    }
    throw new Error("the process closed the stream");
  } catch (e) {
    if (controller.signal.aborted) return;
    setStatus("disconnected: " + e.message + "; retrying", "down");
    setTimeout(follow, 2000);
  }
}

// ---- start -----------------------------------------------------------------

function start() {
  $("#login").hidden = true;
  $("#inbox").hidden = false;
  setStatus("connecting…");
  follow();
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("#token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    state.token = t;
    showBanner("");
    start();
  });
  state.token = takeToken();
  if (state.token) start(); else askForToken();
});
