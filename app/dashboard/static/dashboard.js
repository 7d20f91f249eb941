// kernel-audit dashboard: draws the plots a page carries (figures as JSON next to each .plot), and keeps a
// running audit's section current by fetching its fragment once a second until the audit has finished.
(function () {
  "use strict";

  function draw(root) {
    root.querySelectorAll(".plot").forEach(function (el) {
      if (el.dataset.drawn) return;
      var fig = JSON.parse(el.querySelector("script.figure").textContent);
      window.Plotly.newPlot(el.querySelector(".plot-area"), fig.data, fig.layout, { displaylogo: false, responsive: true })
        .then(function () {
          el.dataset.drawn = "true";
          el.dispatchEvent(new CustomEvent("kaudit:plotted", { bubbles: true }));
        });
    });
  }

  function follow(section) {
    var last = null;
    function poll() {
      fetch(section.dataset.live, { cache: "no-store", credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html !== null && html !== last) {
            last = html;
            var holder = document.createElement("div");
            holder.innerHTML = html.trim();
            var fresh = holder.firstElementChild;
            section.replaceWith(fresh);
            section = fresh;
            draw(section);
            document.dispatchEvent(new CustomEvent("kaudit:updated", { detail: { status: section.dataset.status } }));
          }
        })
        .catch(function () { /* the next poll tries again */ })
        .then(function () {
          if (section.dataset.finished !== "true") window.setTimeout(poll, 1000);
        });
    }
    if (section.dataset.finished !== "true") window.setTimeout(poll, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    draw(document);
    var section = document.getElementById("audit");
    if (section) follow(section);
  });
})();
