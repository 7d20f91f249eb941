// kernel-audit dashboard: progressive enhancement of server-rendered pages (every page works without this file).
//  - draws the plots a page carries (figures as JSON next to each .plot) with the plotly.js served by this site;
//  - keeps a running audit's section current by fetching its fragment every 2 s until the audit has finished;
//  - keeps the live progress view (#live: audits queued or running) current by fetching /live every few seconds;
//  - sorts, filters, searches and pages the tables in place (the same addresses the links and the form use);
//  - keeps relative times ("3 min ago") and elapsed times ticking.
// No inline script, no eval, no style attributes: the page's Content-Security-Policy allows none of them.
(function () {
  "use strict";

  var AUDIT_POLL_MS = 2000, LIVE_ACTIVE_MS = 3000, LIVE_IDLE_MS = 10000, TRACK_MAX = 20;

  function emit(target, name, detail) {
    target.dispatchEvent(new CustomEvent(name, { bubbles: true, detail: detail || {} }));
  }

  // ------------------------------------------------------------ plots

  function draw(root) {
    if (!window.Plotly) return;
    root.querySelectorAll(".plot").forEach(function (el) {
      if (el.dataset.drawn) return;
      var fig = JSON.parse(el.querySelector("script.figure").textContent);
      window.Plotly.newPlot(el.querySelector(".plot-area"), fig.data, fig.layout, { displaylogo: false, responsive: true })
        .then(function () {
          el.dataset.drawn = "true";
          emit(el, "kaudit:plotted");
        });
    });
  }

  // ------------------------------------------------------------ times

  function ago(iso) {
    var s = (Date.now() - Date.parse(iso)) / 1000;
    if (isNaN(s)) return null;
    if (s < 5) return "just now";
    if (s < 60) return Math.floor(s) + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    if (s < 30 * 86400) return Math.floor(s / 86400) + " d ago";
    return iso.slice(0, 10);
  }

  function duration(s) {
    s = Math.max(0, Math.floor(s));
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + two(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + two(Math.floor((s % 3600) / 60)) + " min";
  }

  function relativeTimes(root) {
    root.querySelectorAll("time[data-relative]").forEach(function (t) {
      var words = ago(t.getAttribute("datetime"));
      if (words && t.textContent !== words) t.textContent = words;
    });
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll(".ticking[data-seconds]").forEach(function (el) {
      if (!el.dataset.t0) el.dataset.t0 = String(now);
      el.textContent = duration(parseFloat(el.dataset.seconds) + (now - parseFloat(el.dataset.t0)) / 1000);
    });
  }

  function fragment(html) {
    var holder = document.createElement("div");
    holder.innerHTML = html.trim();
    return holder.firstElementChild;
  }

  // ------------------------------------------------------------ a running audit's own page

  function followAudit(section) {
    var lastRest = null;
    function rest(el) {  // the section without its progress card, whose times change every poll
      var copy = el.cloneNode(true), card = copy.querySelector("#progress");
      if (card) card.remove();
      return copy.innerHTML + "|" + copy.dataset.status;
    }
    lastRest = rest(section);
    function poll() {
      fetch(section.dataset.live, { cache: "no-store", credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          var fresh = fragment(html), freshRest = rest(fresh);
          if (freshRest !== lastRest) {
            lastRest = freshRest;
            section.replaceWith(fresh);
            section = fresh;
            draw(section);
            relativeTimes(section);
            emit(document, "kaudit:updated", { status: section.dataset.status });
          } else {
            var old = section.querySelector("#progress"), card = fresh.querySelector("#progress");
            if (old && card) old.replaceWith(card);
          }
          tick();
        })
        .catch(function () { /* the next poll tries again */ })
        .then(function () {
          if (section.dataset.finished !== "true") window.setTimeout(poll, AUDIT_POLL_MS);
        });
    }
    if (section.dataset.finished !== "true") window.setTimeout(poll, AUDIT_POLL_MS);
  }

  // ------------------------------------------------------------ the live progress view

  function followLive(panel) {
    var tracked = [], timer = null;
    function remember(el) {
      el.querySelectorAll('.live-item[data-status="queued"], .live-item[data-status="running"]').forEach(function (li) {
        var id = li.dataset.submission;
        if (tracked.indexOf(id) < 0) tracked.push(id);
      });
      if (tracked.length > TRACK_MAX) tracked = tracked.slice(tracked.length - TRACK_MAX);
    }
    function address() {
      var url = panel.dataset.live;
      return tracked.length ? url + (url.indexOf("?") < 0 ? "?" : "&") + "track=" + encodeURIComponent(tracked.join(",")) : url;
    }
    function schedule() {
      window.clearTimeout(timer);
      if (document.hidden) return;  // resumed when the tab is shown again
      var busy = panel.dataset.active !== "0" || tracked.length > 0;
      timer = window.setTimeout(poll, busy ? LIVE_ACTIVE_MS : LIVE_IDLE_MS);
    }
    function poll() {
      fetch(address(), { cache: "no-store", credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          var fresh = fragment(html);
          if (fresh.outerHTML !== panel.outerHTML) {
            panel.replaceWith(fresh);
            panel = fresh;
            tick();
          }
          remember(panel);
          var statuses = {};
          panel.querySelectorAll(".live-item").forEach(function (li) { statuses[li.dataset.submission] = li.dataset.status; });
          emit(document, "kaudit:live", { active: parseInt(panel.dataset.active, 10), statuses: statuses });
        })
        .catch(function () { /* the next poll tries again */ })
        .then(schedule);
    }
    document.addEventListener("visibilitychange", function () { if (!document.hidden) poll(); });
    remember(panel);
    schedule();
  }

  // ------------------------------------------------------------ sorting, filters, search and pages in place

  function enhanceListing(listing) {
    var form = document.querySelector("form[data-listing-form]");
    var busy = null, typing = null;

    function load(url, push) {
      if (busy) busy.abort();
      busy = new AbortController();
      listing.setAttribute("aria-busy", "true");
      fetch(url, { credentials: "same-origin", signal: busy.signal, headers: { Accept: "text/html" } })
        .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.text(); })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById(listing.id);
          if (!fresh) throw new Error("no listing");
          listing.replaceWith(fresh);
          listing = fresh;
          [["form[data-listing-form]", "input[type=hidden]"], ["nav.filters", null]].forEach(function (pair) {
            var mine = document.querySelector(pair[0]), theirs = doc.querySelector(pair[0]);
            if (!mine || !theirs) return;
            if (pair[1] === null) { mine.replaceWith(document.importNode(theirs, true)); return; }
            mine.querySelectorAll(pair[1]).forEach(function (el) { el.remove(); });
            theirs.querySelectorAll(pair[1]).forEach(function (el) { mine.prepend(document.importNode(el, true)); });
          });
          if (push) window.history.pushState({ listing: true }, "", url);
          relativeTimes(listing);
          emit(listing, "kaudit:listing", { url: url });
        })
        .catch(function (err) { if (err.name !== "AbortError") window.location.assign(url); });
    }

    function formAddress() {
      var params = new URLSearchParams();
      new FormData(form).forEach(function (v, k) { if (v !== "") params.append(k, v); });
      var q = params.toString();
      return window.location.pathname + (q ? "?" + q : "");
    }

    document.addEventListener("click", function (e) {
      var a = e.target.closest && e.target.closest("a[data-listing-link]");
      if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      var url = new URL(a.href, window.location.href);
      if (url.origin !== window.location.origin || url.pathname !== window.location.pathname) return;
      e.preventDefault();
      if (a.classList.contains("clear") && form) {
        form.querySelectorAll("input[type=search]").forEach(function (i) { i.value = ""; });
        form.querySelectorAll("select").forEach(function (s) { s.value = ""; });
      }
      load(url.pathname + url.search, true);
    });
    if (form) {
      form.addEventListener("submit", function (e) { e.preventDefault(); load(formAddress(), true); });
      form.querySelectorAll("select").forEach(function (s) {
        s.addEventListener("change", function () { load(formAddress(), true); });
      });
      form.querySelectorAll("input[type=search]").forEach(function (i) {
        i.addEventListener("input", function () {
          window.clearTimeout(typing);
          typing = window.setTimeout(function () { load(formAddress(), true); }, 300);
        });
      });
    }
    window.addEventListener("popstate", function () {
      var params = new URLSearchParams(window.location.search);
      if (form) {
        form.querySelectorAll("input[type=search], select").forEach(function (el) { el.value = params.get(el.name) || ""; });
      }
      load(window.location.pathname + window.location.search, false);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.documentElement.classList.add("js");
    var section = document.getElementById("audit");
    if (section) followAudit(section);  // first: it notes the section as served, before plotly draws into it
    draw(document);
    var panel = document.getElementById("live");
    if (panel) followLive(panel);
    var listing = document.querySelector("[data-listing]");
    if (listing) enhanceListing(listing);
    tick();
    window.setInterval(tick, 1000);
    window.setInterval(function () { relativeTimes(document); }, 30000);
  });
})();
